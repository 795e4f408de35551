"""Tinker calls in their tenants' quotas (issue 45 points 3 and 6; tinker/metering.py, tinker/holdings.py) against a
real ``openrft serve`` on 127.0.0.1 without a cluster, raw HTTP as the SDK sends it, two API keys:

- a's forward_backward and optim_step raise a's CPU-seconds on ``GET /v1/openrft/quota`` (the jobs' accounting),
  b's stay 0;
- the dashboard's cluster JSON lists the in-process host with a's and b's training clients: each tenant its own
  by id, the other's as "another tenant's client" without its id;
- the operator sets a's quota below its use while a's long call runs: that call finishes; a's next call is
  refused 429 ``insufficient_quota`` naming the quota (not retried by the SDK: ``x-should-retry: false``), and b's
  calls go on.
Without the metering a's use stays 0 and the refusal never comes; without the check a's call is accepted."""

from __future__ import annotations

import os
import time

import httpx
import pytest

pytest.importorskip("tinker")

from openrft.service.store import Store
from tests.service.svc_helpers import Service
from tests.tinker_api.test_cancel import SHORT, answer, call, forward_backward, grad_norm, model, session

LONG = [[(i * 7 + j) % 90 for i in range(1500)] for j in range(4)]  # a call of a few parts (about a second)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker-quota")
    service = Service(root, f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    store = Store.open(service.database_url)
    made = [store.create_key(name) for name in ("a", "b")]
    service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
    yield service, tuple("tml-" + secret for _, secret in made), [key.id for key, _ in made], store
    store.close()
    service.stop_all()


def get(server, path: str, key: int) -> dict:
    service, keys, _, _ = server
    bearer = {"Authorization": f"Bearer {keys[key].removeprefix('tml-')}"}
    response = httpx.get(service.base_url + path, headers=bearer, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def ok(response: httpx.Response) -> bool:
    """A future answered with its result (a forward_backward's is protobuf), not ``{"error"}``."""
    return "json" not in response.headers["content-type"] or "error" not in response.json()


def used(server, key: int) -> float:
    return get(server, "/v1/openrft/quota", key)["data"][0]["cpu_seconds"]["used"]


def test_tinker_calls_count_in_the_quota_and_a_tenant_past_it_is_refused_by_name(server):
    service, keys, ids, store = server
    http = (service, keys)  # the raw-HTTP helpers' server
    a_model = model(http, session(http, 0), 0, 0)
    assert ok(answer(http, forward_backward(http, a_model, LONG[:2], 0), 0))
    grad_norm(http, a_model, 0)  # optim_step: the use is written soon after it
    deadline = time.monotonic() + 15
    while used(server, 0) == 0:
        assert time.monotonic() < deadline, "a's Tinker calls never showed in its CPU-seconds"
        time.sleep(0.5)
    assert used(server, 1) == 0

    b_model = model(http, session(http, 1), 0, 1)
    page = get(server, "/v1/dashboard/cluster", 0)["tinker"]
    assert page["source"] == "local" and [h["node"] for h in page["hosts"]] == ["local"], page
    clients = page["hosts"][0]["clients"]
    assert {"kind": "training", "client": a_model, "tenant": ids[0], "base_model": "openrft-demo"} in clients
    assert {"kind": "training", "client": None, "tenant": None, "name": "another tenant's client"} in clients
    assert b_model not in str(page) and ids[1] not in str(page)
    assert page["hosts"][0]["tenants"] == {ids[0]: 1, "another tenant's client": 1}
    assert b_model in str(get(server, "/v1/dashboard/cluster", 1)["tinker"])

    running = forward_backward(http, a_model, LONG, 0)
    store.set_quota(ids[0], cpu_seconds=0.01, gpu_seconds=None)  # below a's use: its running call goes on
    assert ok(answer(http, running, 0))
    time.sleep(2.5)  # the server reads a tenant's quota again after metering.CACHE_S
    body = {"model_id": a_model, "optim_params": {"learning_rate": 1e-3}}
    for route, key, content in (("forward_backward", 0, None), ("optim_step", 0, body)):
        refused = call(http, route, content, key) if content else call(http, route, key=key, content=b"")
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "insufficient_quota"
        assert "tenant quota: " in refused.json()["detail"] and "CPU-seconds used of 0.01" in refused.json()["detail"]
        assert refused.headers["x-should-retry"] == "false"
    assert ok(answer(http, forward_backward(http, b_model, [SHORT], 1), 1))  # b unaffected
    report = get(server, "/v1/openrft/quota", 0)["data"][0]
    assert report["exhausted"] and report["cpu_seconds"]["limit"] == 0.01 and report["cpu_seconds"]["used"] > 0.01


def test_the_cluster_page_shows_the_tinker_clients_in_chromium(server):
    """The dashboard's cluster page as a sees it (headless Chromium, as tests/service/test_cluster_quotas.py): the
    server process as the Tinker host, a's client by id, b's as another tenant's."""
    import shutil
    from pathlib import Path

    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.fail(f"Chromium is not installed at {chromium} (.ci/run installs Debian's chromium)")
    service, keys, ids, store = server
    http = (service, keys)
    if store.remove_quota(ids[0]):  # the test above left a past its quota
        time.sleep(2.5)
    a_model, b_model = (model(http, session(http, key), 5, key) for key in (0, 1))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"], headless=True)
        try:
            view = browser.new_page(viewport={"width": 1360, "height": 1000})
            errors: list[str] = []
            view.on("pageerror", lambda exc: errors.append(str(exc)))
            view.goto(service.base_url + "/?view=cluster")
            view.locator("#key-view").wait_for(state="visible", timeout=15_000)
            view.fill("#key-input", keys[0].removeprefix("tml-"))
            view.click("#key-form button")
            view.locator("#tinker-part").wait_for(state="visible", timeout=15_000)
            assert "server process" in view.locator("#tinker-source").inner_text()
            assert view.locator("#tinker-hosts tr[data-node='local']").count() == 1
            view.locator(f"#tinker-clients tr[data-client='{a_model}']").wait_for(timeout=15_000)
            clients = view.locator("#tinker-clients").inner_text()
            assert "another tenant's client" in clients and b_model not in clients
            assert not errors, errors
        finally:
            browser.close()
