"""Quotas, priorities and the cluster view through a real server on a real local Ray cluster (three nodes of one CPU,
``test_cluster.three_nodes``), jobs submitted with the official ``openai`` client, as a Nova recipe and as a Vertex
body by two tenants (API keys), the operator's quotas set with ``openrft keys quota``, the dashboard's cluster page in
headless Chromium (Debian's, driven by Playwright, as tests/monitoring/test_dashboard_browser.py).

- alice's quota of 0 CPU-seconds: her job is refused at submission, 429 ``insufficient_quota``, naming the quota;
- raised to 10: her first job (2 learners, 2 CPUs) runs and passes it; her second, submitted meanwhile, then stays
  queued with the reason naming the quota while bob's job, submitted after it, starts (one worker: one job at a time);
- the quota route shows each tenant's use against its quota; the cluster page shows Ray's three nodes, which job
  holds what (bob's job to alice as "another tenant's job"), the queue with the reason, alice's use against her quota;
- the operator lifts the quota: alice's job starts.
Without the quota check at start alice's second job starts before bob's; without the accounting her use stays 0 and
it starts too: the test fails."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.service.svc_helpers import ROOT, TRAIN, VALIDATION, small_dataset, tiny_recipe, upload
from tests.service.test_cluster import demo_job, three_nodes
from tests.service.test_vertex import BASE, vertex_request

ray = pytest.importorskip("ray")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def cluster():
    yield from three_nodes()


def _until(check, timeout: float, what):
    """``check()`` once it is true; ``what`` (or what it returns, if callable) says what was awaited."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, (
            f"timed out after {timeout}s waiting for {what() if callable(what) else what}"
        )
        time.sleep(0.5)
    return found


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_tenant_past_its_quota_waits_by_name_while_another_goes_ahead_and_the_dashboard_shows_the_cluster(
    cluster, service, tmp_path
):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (.ci/run installs Debian's chromium)")
    alice_key, bob_key = service.create_key("alice"), service.create_key("bob")

    def operator(*args: str) -> str:
        done = service.cli(
            "keys", "quota", *args, "--data-dir", str(service.data_dir), "--database-url", service.database_url
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    operator("alice", "--cpu-seconds", "0")
    service.serve(workers=1, extra=("--ray-address", cluster.address))
    alice = openai.OpenAI(base_url=service.base_url + "/v1", api_key=alice_key, max_retries=0)
    http = {
        who: httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        for who, key in (("alice", alice_key), ("bob", bob_key))
    }
    with small_dataset(tmp_path / "train.jsonl", TRAIN, 8).open("rb") as f:
        train = alice.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4).open("rb") as f:
        validation = alice.files.create(file=f, purpose="fine-tune")

    def create(**openrft):
        return demo_job(alice, train.id, validation.id, **openrft)

    # a quota of 0: refused at submission, by name, as OpenAI refuses a key past its quota
    with pytest.raises(openai.RateLimitError) as refused:
        create(runtime="ray", replicas=2)
    assert refused.value.body["code"] == "insufficient_quota"
    assert refused.value.body["message"].startswith("tenant quota: 0 CPU-seconds used of 0")

    operator("alice", "--cpu-seconds", "10")
    first = create(runtime="ray", replicas=2)  # 2 CPUs: past 10 CPU-seconds after 5 s of running
    assert first.to_dict()["priority"] == 0
    recipe = tiny_recipe(train.id, validation.id, steps=1)
    recipe["openrft"].update(runtime="ray", device="cpu", priority=-2)  # after the first, if both wait
    second = http["alice"].post("/v1/nova/jobs", json=recipe)
    assert second.status_code == 200, second.text
    assert second.json()["priority"] == -2
    second_id = second.json()["id"]
    vertex_file = small_dataset(tmp_path / "vt.jsonl", ROOT / "examples/arithmetic/vertex_train.jsonl", 8)
    body = vertex_request(upload(http["bob"], vertex_file), upload(http["bob"], vertex_file), 40)
    body["openrft"].update(device="cpu", priority=-3)
    created = http["bob"].post(f"{BASE}/tuningJobs", json=body)
    assert created.status_code == 200, created.text
    assert created.json()["priority"] == -3
    bob_job = created.json()["name"].rsplit("/", 1)[-1]

    # while alice's first job runs: it holds 2 bundles of 1 CPU on two of Ray's nodes (its placement group)
    seen = {}

    def holding():
        seen["page"] = page = http["alice"].get("/v1/dashboard/cluster").json()
        return page if [h for h in page["held"] if h["job"] == first.id] else None

    page = _until(holding, 240, lambda: f"alice's first job to hold its placement group: {seen}")
    assert page["source"] == "ray" and len(page["nodes"]) == 3
    ray_nodes = {n["NodeID"] for n in cluster.global_state.node_table() if n["Alive"]}
    assert {n["id"] for n in page["nodes"]} == ray_nodes
    assert sorted(n["cpu"] for n in page["nodes"]) == [1.0, 1.0, 1.0]
    held = [h for h in page["held"] if h["job"] == first.id]
    assert len(held) == 2 and {h["node"] for h in held} <= ray_nodes and len({h["node"] for h in held}) == 2
    assert sum(n["held"]["cpu"] for n in page["nodes"]) == 2.0

    # alice's first job ends past her quota: her second waits, naming it; bob's, submitted after it, starts
    def second_waits():  # or starts, which it must not
        job = http["alice"].get(f"/v1/fine_tuning/jobs/{second_id}").json()
        quota = (job["queue_reason"] or "").startswith("tenant quota: ")
        return job if quota or job["status"] != "queued" else None

    waiting = _until(second_waits, 300, "alice's second job to wait for her quota")
    assert waiting["status"] == "queued" and waiting["queue_reason"].endswith("CPU-seconds used of 10")
    assert alice.fine_tuning.jobs.retrieve(first.id).status == "succeeded"
    _until(lambda: http["bob"].get(f"/v1/fine_tuning/jobs/{bob_job}").json()["status"] == "running", 120, "bob's job")
    assert http["alice"].get(f"/v1/fine_tuning/jobs/{second_id}").json()["status"] == "queued"

    # the quota route: each tenant its own use against its quota
    mine = http["alice"].get("/v1/openrft/quota").json()
    assert not mine["operator"] and [q["tenant"] for q in mine["data"]] == [first.organization_id[4:]]
    quota = mine["data"][0]
    assert quota["cpu_seconds"]["limit"] == 10 and quota["cpu_seconds"]["used"] >= 10 and quota["exhausted"]
    assert quota["set_for"] == "this tenant"
    bobs = http["bob"].get("/v1/openrft/quota").json()["data"][0]
    assert bobs["cpu_seconds"]["limit"] is None and not bobs["exhausted"]

    # the dashboard's cluster page, as alice sees it
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"], headless=True)
        try:
            view = browser.new_page(viewport={"width": 1360, "height": 1000})
            errors: list[str] = []
            view.on("pageerror", lambda exc: errors.append(str(exc)))
            view.goto(service.base_url + "/?view=cluster")
            view.locator("#key-view").wait_for(state="visible", timeout=15_000)
            view.fill("#key-input", alice_key)
            view.click("#key-form button")
            view.locator("#cluster-view").wait_for(state="visible", timeout=15_000)
            view.locator("#nodes tbody tr").nth(2).wait_for(timeout=15_000)
            assert view.locator("#nodes tbody tr").count() == 3
            assert "Ray cluster" in view.locator("#cluster-source").inner_text()
            for node in ray_nodes:
                assert view.locator(f"#nodes tr[data-node-id='{node}']").count() == 1
            queued = view.locator(f"#queue tr[data-job-id='{second_id}']")
            queued.wait_for(timeout=15_000)
            assert "tenant quota: " in queued.inner_text() and "CPU-seconds used of 10" in queued.inner_text()
            assert queued.locator("td").nth(2).inner_text() == "-2"  # its priority
            use = view.locator("#quotas tbody tr")
            assert use.count() == 1 and "10" in use.inner_text() and "used up" in use.inner_text()
            # bob's running job holds its CPU, shown to alice without its id
            _until(lambda: "another tenant's job" in view.locator("#held").inner_text(), 30, "bob's job held")
            assert bob_job not in view.locator("#held").inner_text()
            assert not errors, errors
        finally:
            browser.close()

    # the operator lifts the quota: alice's job is admitted (and cancelled here: it has shown what it should)
    operator("alice", "--cpu-seconds", "none")
    http["bob"].post(f"/v1/fine_tuning/jobs/{bob_job}/cancel")

    def second_started():
        job = http["alice"].get(f"/v1/fine_tuning/jobs/{second_id}").json()
        return job if job["status"] != "queued" else None

    started = _until(second_started, 180, "alice's second job to start")
    assert started["status"] in ("running", "succeeded"), started
    http["alice"].post(f"/v1/fine_tuning/jobs/{second_id}/cancel")
    tenant = first.organization_id.removeprefix("org-")
    listed = {line.split("\t")[0]: line for line in operator().splitlines()[1:]}
    assert listed[tenant].split("\t")[1].endswith("/-")  # its use, no limit now
