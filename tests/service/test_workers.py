"""Standalone workers against one store: racing claims, and a worker killed with SIGKILL mid-job."""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
import psutil
import pytest

from openrft.service.store import Store
from tests.service.svc_helpers import TRAIN, VALIDATION, all_events, small_dataset, tiny_recipe, upload, wait_status

pytestmark = pytest.mark.slow
FINISHED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def api(service, tmp_path):
    service.serve(workers=0)  # the API only: jobs run on the standalone workers each test starts
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        train = upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
        validation = upload(client, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4))
        yield client, (train, validation)


def test_two_workers_race_for_ten_jobs_and_run_each_exactly_once(api, service):
    client, datasets = api
    ids = []
    for i in range(10):
        recipe = tiny_recipe(*datasets, steps=1, name=f"race-{i}")
        recipe["openrft"]["eval_at_start"] = False
        ids.append(client.post("/v1/nova/jobs", json=recipe).json()["id"])
    service.worker()
    service.worker()
    finished = [wait_status(client, job_id, FINISHED, timeout=300) for job_id in ids]
    assert [j["status"] for j in finished] == ["succeeded"] * 10

    store = Store.open(service.database_url, run_migrations=False)
    try:
        attempts = [store.get_job(None, job_id).attempts for job_id in ids]
    finally:
        store.close()
    assert attempts == [1] * 10
    workers = Counter()
    for job_id in ids:
        started = [e["message"] for e in all_events(client, job_id) if e["message"].startswith("Job started")]
        assert len(started) == 1, started
        workers[started[0].rsplit(" ", 1)[-1]] += 1
    assert sum(workers.values()) == 10 and len(workers) == 2  # both took part


def test_a_killed_worker_s_job_is_requeued_and_resumes_from_its_checkpoint(api, service):
    client, datasets = api
    job_id = client.post("/v1/nova/jobs", json=tiny_recipe(*datasets, steps=16, save_steps=2)).json()["id"]
    victim = service.worker(heartbeat_timeout=3)
    deadline = time.monotonic() + 120
    while client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["step"] < 5:
        assert time.monotonic() < deadline, "the job never reached step 5"
        time.sleep(0.05)
    job_processes = psutil.Process(victim.proc.pid).children()
    assert job_processes, "the worker runs its job in a process of its own"
    victim.kill()  # SIGKILL: no chance to hand the job back
    _gone, alive = psutil.wait_procs(job_processes, timeout=10)
    assert not alive, "the job process outlived its worker"
    before = {r["step"]: r for r in client.get(f"/v1/fine_tuning/jobs/{job_id}/metrics").json()["data"]}
    killed_at = max(before)
    checkpoints = sorted(
        int(p.name.removeprefix("step-")) for p in (service.data_dir / "runs" / job_id / "checkpoints").glob("step-*")
    )
    checkpoint = checkpoints[-1]
    assert 5 <= killed_at < 16 and checkpoint % 2 == 0 and killed_at - 2 <= checkpoint <= killed_at
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] == "running"  # until the heartbeat expires

    service.worker(heartbeat_timeout=3)
    done = wait_status(client, job_id, FINISHED, timeout=300)
    assert done["status"] == "succeeded", done
    messages = [e["message"] for e in all_events(client, job_id)]
    assert any("stopped heartbeating; requeued" in m for m in messages)
    assert f"Resuming from the checkpoint at step {checkpoint}" in messages

    rows = client.get(f"/v1/fine_tuning/jobs/{job_id}/metrics").json()["data"]
    assert [r["step"] for r in rows] == list(range(17))  # every step exactly once
    for row in rows[: checkpoint + 1]:
        assert row == before[row["step"]]  # recorded before the kill, kept as it was
    steps = [e["data"]["step"] for e in all_events(client, job_id) if e["type"] == "metrics"]
    assert sorted(steps) == list(range(17))
    lines = (service.data_dir / "runs" / job_id / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(17))
