"""Tenants share the service fairly (issue 24): per-key shares of the grader pool, grader calls stopped when
their client hangs up, queued jobs and stored bytes capped per key. Claims taking turns: test_store.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from openrft.service.errors import ApiError
from openrft.service.graders import WorkPool
from tests.rewards.helpers import require_bwrap
from tests.service.svc_helpers import app_in_thread


def test_one_key_s_72_slow_calls_do_not_shut_out_another_key():
    """The global pool holds 8 + 64 calls; one key gets 16 places and 4 workers, and another key's call runs at
    once while the first key's calls are all stuck."""
    release = threading.Event()

    async def go():
        pool = WorkPool(workers=8, queue_limit=64, tenant_workers=4, tenant_calls=16)
        greedy = [asyncio.create_task(pool.run(release.wait, 30, tenant="greedy")) for _ in range(72)]
        await asyncio.sleep(0.2)
        refused = [t for t in greedy if t.done() and isinstance(t.exception(), ApiError)]
        assert len(refused) == 72 - 16 and all(t.exception().status == 429 for t in refused)
        assert "limit per API key" in refused[0].exception().message
        assert pool.running("greedy") == 4
        other = await asyncio.wait_for(pool.run(lambda: "answered", tenant="polite"), 5)
        release.set()
        await asyncio.gather(*greedy, return_exceptions=True)
        pool.shutdown()
        return other

    assert asyncio.run(go()) == "answered"


def test_a_freed_worker_goes_to_the_tenant_with_the_fewest_calls_running():
    order: list[str] = []
    gate = threading.Event()

    def work(name: str) -> None:
        gate.wait(10)
        order.append(name)

    async def go():
        pool = WorkPool(workers=1, queue_limit=10, tenant_workers=1, tenant_calls=10)
        calls = [asyncio.create_task(pool.run(work, f"a{i}", tenant="a")) for i in range(4)]
        await asyncio.sleep(0.05)
        calls.append(asyncio.create_task(pool.run(work, "b0", tenant="b")))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*calls)
        pool.shutdown()

    asyncio.run(go())
    assert order == ["a0", "b0", "a1", "a2", "a3"]  # first in, first out would run b0 last


@pytest.fixture
def app_server(tmp_path) -> Iterator[tuple[object, str, list[str]]]:
    """The service app in this process (its pool and store inspectable), served by uvicorn on 127.0.0.1, with
    small quotas and two keys."""

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(
        tmp_path / "data",
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        max_stored_mb_per_tenant=1,
        max_queued_jobs_per_tenant=0,
    )
    store = Store.open(config.database_url)
    keys = [store.create_key(name)[1] for name in ("alice", "bob")]
    app = create_app(config, store)
    try:
        with app_in_thread(app) as port:
            yield app, f"http://127.0.0.1:{port}", keys
    finally:
        store.close()


SLOW = {
    "type": "python",
    "name": "slow",
    "source": "import time\n\ndef grade(sample, item):\n    time.sleep(60)\n    return 1.0\n",
}


def test_a_grader_call_whose_client_hangs_up_is_stopped(app_server):
    """The call's sandbox is killed when the client closes its connection, not 60 s later when it would end."""
    require_bwrap()
    app, base_url, keys = app_server
    pool = app.state.grader_pool
    body = json.dumps({"grader": SLOW, "model_sample": "x", "item": {}}).encode()
    host, port = base_url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(
        b"POST /v1/fine_tuning/alpha/graders/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {keys[0]}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    deadline = time.monotonic() + 20
    while pool.running() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.running() == 1
    time.sleep(2)  # the sandbox has started and user code sleeps
    conn.close()
    hung_up = time.monotonic()
    while pool.running() and time.monotonic() - hung_up < 20:
        time.sleep(0.1)
    assert pool.running() == 0 and time.monotonic() - hung_up < 15


def test_stored_bytes_and_queued_jobs_are_capped_per_key(app_server, tmp_path):
    _app, base_url, keys = app_server
    line = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}) + "\n"
    data = (line * 600).encode()  # ~610 KB: one fits the 1 MiB quota, two do not
    clients = [httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {k}"}, timeout=60) for k in keys]
    try:

        def post(client: httpx.Client) -> httpx.Response:
            return client.post("/v1/files", files={"file": ("a.jsonl", data)}, data={"purpose": "fine-tune"})

        assert post(clients[0]).status_code == 200
        refused = post(clients[0])
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"]["code"] == "storage_quota_exceeded"
        assert "limit of 1,048,576 bytes stored per API key" in refused.json()["error"]["message"]
        assert post(clients[1]).status_code == 200  # the other key's room is its own
        assert len(clients[0].get("/v1/files").json()["data"]) == 1  # nothing of the refused file was kept
        job = clients[0].post(
            "/v1/fine_tuning/jobs", json={"model": "openrft-demo", "training_file": "file-x", "method": {}}
        )
        assert job.status_code == 429 and job.json()["error"]["code"] == "queued_jobs_limit", job.text
        assert "limit of 0 queued jobs per API key" in job.json()["error"]["message"]
    finally:
        for client in clients:
            client.close()
