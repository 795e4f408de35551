"""Stopping Tinker calls against a real ``openrft serve`` on 127.0.0.1 (issue 49 point 6, futures.py): the API's
``cancel_future`` drops a queued call and stops a running ``forward_backward`` at its next part, the training
client's gradients left as they were before it (checked through ``optim_step``'s grad_norm against a twin client
that never ran the cancelled call); a session whose heartbeats stop (a client gone) has its queued calls dropped
and its running one stopped, while a session that keeps beating is served. Raw HTTP as the SDK sends it."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

pytest.importorskip("tinker")

from openrft.service.store import Store
from tests.service.svc_helpers import Service
from tests.tinker_api.test_hostile import fb_request, good_datum

MODEL = "openrft-demo"
ABANDON_S = 5  # --tinker-abandon-after-s here: a session silent this long is a client gone
# a call of many parts: a 2,000-token datum whole (its gradient accumulated in the first part), then 32,000 tokens
# in datums of 4,000, each in pieces along its sequence
LONG = [[(i * 3) % 90 for i in range(2000)]] + [[(i * 7 + j) % 90 for i in range(4000)] for j in range(8)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker-cancel")
    service = Service(root, f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    store = Store.open(service.database_url)
    keys = tuple("tml-" + store.create_key(name)[1] for name in ("a", "b"))
    store.close()
    extra = ("--tinker-abandon-after-s", str(ABANDON_S))
    service.wait_healthy(service.serve(workers=0, wait=False, extra=extra), timeout=400)
    yield service, keys
    service.stop_all()


def call(server, route: str, body: dict | None = None, key: int = 0, content: bytes | None = None) -> httpx.Response:
    service, keys = server
    headers = {"X-API-Key": keys[key]}
    if content is not None:
        headers["Content-Type"] = "application/octet-stream"
        return httpx.post(f"{service.base_url}/api/v1/{route}", content=content, headers=headers, timeout=60)
    return httpx.post(f"{service.base_url}/api/v1/{route}", json=body, headers=headers, timeout=60)


def submitted(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["request_id"]


def answer(server, request_id: str, key: int = 0) -> httpx.Response:
    """The future's answer once it has one (the retrieve long-polls, as the SDK's does)."""
    for _ in range(60):
        response = call(server, "retrieve_future", {"request_id": request_id}, key)
        assert response.status_code == 200, response.text
        if "json" not in response.headers["content-type"] or response.json().get("type") != "try_again":
            return response
    raise AssertionError(f"{request_id} did not finish")


def error(server, request_id: str, key: int = 0) -> str:
    response = answer(server, request_id, key)
    assert "json" in response.headers["content-type"] and "error" in response.json(), response.content[:200]
    return response.json()["error"]


def session(server, key: int = 0) -> str:
    body = {"tags": [], "user_metadata": None, "sdk_version": "0.38.0", "type": "create_session"}
    return call(server, "create_session", body, key).json()["session_id"]


def beat(server, session_id: str, key: int = 0) -> None:
    response = call(server, "session_heartbeat", {"session_id": session_id, "type": "session_heartbeat"}, key)
    assert response.status_code == 200, response.text


class Beating:
    """The SDK's heartbeat for ``sessions``, every 0.5 s while the block runs."""

    def __init__(self, server, *sessions: tuple[str, int]):
        self.server, self.sessions, self.done = server, sessions, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.5):
            for session_id, key in self.sessions:
                beat(self.server, session_id, key)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(10)


def model(server, session_id: str, seq: int, key: int = 0) -> str:
    body = {"session_id": session_id, "model_seq_id": seq, "base_model": MODEL, "lora_config": {"rank": 4, "seed": 0}}
    request_id = submitted(call(server, "create_model", body, key))
    return answer(server, request_id, key).json()["model_id"]


def forward_backward(server, model_id: str, sequences: list[list[int]], key: int = 0) -> str:
    return submitted(
        call(server, "forward_backward", key=key, content=fb_request(model_id, list(map(good_datum, sequences))))
    )


def grad_norm(server, model_id: str, key: int = 0) -> float:
    body = {"model_id": model_id, "optim_params": {"learning_rate": 1e-3, "grad_clip_norm": 1e9}}
    return answer(server, submitted(call(server, "optim_step", body, key)), key).json()["metrics"]["grad_norm"]


SHORT = [5, 17, 33, 8, 61, 2, 40, 12, 9, 70]


def test_cancel_future_drops_a_queued_call_and_stops_a_running_one_leaving_its_gradients(server):
    sessions = (session(server), session(server, key=1))
    with Beating(server, (sessions[0], 0), (sessions[1], 1)):
        cancelled, twin = model(server, sessions[0], 0), model(server, sessions[0], 1)
        other = model(server, sessions[1], 0, key=1)
        for model_id in (cancelled, twin):
            answer(server, forward_backward(server, model_id, [SHORT]))
        running = forward_backward(server, cancelled, LONG)
        queued = forward_backward(server, cancelled, [SHORT])
        errors: dict[str, str] = {}  # both retrieved from now on, as the SDK does (not a client gone)
        threads = [
            threading.Thread(target=lambda r=r: errors.setdefault(r, error(server, r))) for r in (running, queued)
        ]
        for thread in threads:
            thread.start()
        # another tenant's call runs at the next turn: once it is answered, the long call has begun its parts
        answer(server, forward_backward(server, other, [SHORT], key=1), key=1)
        assert call(server, "cancel_future", {"request_id": running}, key=1).status_code == 404  # not b's
        outcomes = [call(server, "cancel_future", {"request_id": r}).json()["cancel"] for r in (queued, running)]
        assert outcomes == ["dropped", "stopping"], [answer(server, r).content[:300] for r in (queued, running)]
        for thread in threads:
            thread.join(60)
        assert "cancelled between its parts: cancelled by cancel_future" in errors[running]
        assert "cancelled before it ran: cancel_future" in errors[queued]
        # the cancelled call left nothing: the accumulated gradient is the short datum's, as on the twin
        assert grad_norm(server, cancelled) == pytest.approx(grad_norm(server, twin), rel=1e-5)


def test_a_session_whose_heartbeats_stop_has_its_calls_dropped_and_stopped(server):
    gone, here = session(server), session(server, key=1)
    with Beating(server, (here, 1)):
        silent = model(server, gone, 0)
        served = model(server, here, 0, key=1)
        running = forward_backward(server, silent, LONG)
        queued = forward_backward(server, silent, [SHORT])
        kept = forward_backward(server, served, LONG[:3], key=1)  # runs longer than ABANDON_S beside the other
        started = time.monotonic()
        results: dict[str, object] = {}
        # every future retrieved all along (the retrieve long-polls): only the silent heartbeat tells a client left
        threads = [
            threading.Thread(target=lambda r=r: results.setdefault(r, error(server, r))) for r in (running, queued)
        ]
        threads.append(threading.Thread(target=lambda: results.setdefault(kept, answer(server, kept, key=1))))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert time.monotonic() - started >= ABANDON_S - 1
        assert f"session {gone} sent no heartbeat" in results[running], results
        assert "cancelled between its parts" in results[running]
        assert f"cancelled before it ran: session {gone} sent no heartbeat" in results[queued], results
        kept_answer = results[kept]
        assert "json" not in kept_answer.headers["content-type"], kept_answer.text  # its outputs, not an error
