"""Per-key bounds of the Tinker API (issue 49 point 6) against a real ``openrft serve`` on 127.0.0.1: training
clients and sampling sessions per API key, each cap refused (400) by name; a finished session's clients freed
(their ids answer not found, their room in the cap is back); Tinker checkpoints counted in the key's storage
quota (``--max-stored-mb``, 413 by name). Raw HTTP as the SDK sends it."""

from __future__ import annotations

import os
import time

import httpx
import pytest

pytest.importorskip("tinker")

from openrft.service.store import Store
from tests.service.svc_helpers import Service

MODEL = "openrft-demo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker-caps")
    service = Service(root, f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    store = Store.open(service.database_url)
    keys = tuple("tml-" + store.create_key(name)[1] for name in ("a", "b", "c"))
    store.close()
    caps = ("--tinker-max-training-clients", "2", "--tinker-max-sampling-sessions", "1", "--max-stored-mb", "1")
    service.wait_healthy(service.serve(workers=0, wait=False, extra=caps), timeout=400)
    yield service, keys
    service.stop_all()


def call(server, route: str, body: dict, key: int = 0) -> httpx.Response:
    service, keys = server
    return httpx.post(f"{service.base_url}/api/v1/{route}", json=body, headers={"X-API-Key": keys[key]}, timeout=60)


def result(server, response: httpx.Response, key: int = 0) -> dict:
    assert response.status_code == 200, response.text
    request_id = response.json()["request_id"]
    for _ in range(30):
        answer = call(server, "retrieve_future", {"request_id": request_id}, key).json()
        if answer.get("type") != "try_again":
            assert "error" not in answer, answer
            return answer
        time.sleep(0.1)
    raise AssertionError(f"{request_id} did not finish")


def session(server, key: int = 0) -> str:
    body = {"tags": [], "user_metadata": None, "sdk_version": "0.38.0", "type": "create_session"}
    return call(server, "create_session", body, key).json()["session_id"]


def create_model(server, session_id: str, seq: int, key: int = 0) -> httpx.Response:
    body = {"session_id": session_id, "model_seq_id": seq, "base_model": MODEL, "lora_config": {"rank": 4, "seed": 0}}
    return call(server, "create_model", body, key)


def create_sampler(server, session_id: str, seq: int, key: int = 0) -> httpx.Response:
    body = {"session_id": session_id, "sampling_session_seq_id": seq, "base_model": MODEL}
    return call(server, "create_sampling_session", body, key)


def test_each_cap_is_refused_by_name_and_a_finished_session_frees_its_clients(server):
    first = session(server)
    models = [result(server, create_model(server, first, seq))["model_id"] for seq in range(2)]
    refused = create_model(server, first, 2)
    assert refused.status_code == 400 and "--tinker-max-training-clients" in refused.text, refused.text
    assert "training clients: this API key has 2" in refused.text
    assert create_sampler(server, first, 0).status_code == 200
    refused = create_sampler(server, first, 1)
    assert refused.status_code == 400 and "--tinker-max-sampling-sessions" in refused.text, refused.text
    # another key's caps are its own
    other = session(server, key=1)
    result(server, create_model(server, other, 0, key=1), key=1)
    assert create_sampler(server, other, 0, key=1).status_code == 200

    assert call(server, f"sessions/{first}/finish", {}).status_code == 200
    for _ in range(50):  # freed on the worker, after what it runs
        if call(server, "get_info", {"model_id": models[0]}).status_code == 404:
            break
        time.sleep(0.1)
    assert all(call(server, "get_info", {"model_id": m}).status_code == 404 for m in models)
    second = session(server)
    result(server, create_model(server, second, 0))
    result(server, create_model(server, second, 1))  # both places back
    assert create_sampler(server, second, 0).status_code == 200


def test_tinker_checkpoints_count_in_the_storage_quota(server):
    sess = session(server, key=2)
    model_id = result(server, create_model(server, sess, 0, key=2), key=2)["model_id"]
    saved = []
    for i in range(10):  # a rank-4 adapter of the demo model is about 156 KB; the key may store 1 MB
        response = call(server, "save_weights", {"model_id": model_id, "path": f"s{i}"}, key=2)
        if response.status_code != 200:
            break
        saved.append(result(server, response, key=2)["path"])
    assert response.status_code == 413, response.text
    assert 3 <= len(saved) <= 6, saved
    assert "--max-stored-mb" in response.text and "Tinker checkpoints" in response.text
    # and an upload counts them too: 200 KB of files would pass the megabyte with them
    service, keys = server
    lines = b'{"prompt": "x"}\n' * (200_000 // 16)
    upload = httpx.post(
        f"{service.base_url}/v1/files",
        files={"file": ("data.jsonl", lines)},
        data={"purpose": "fine-tune"},
        headers={"Authorization": f"Bearer {keys[2].removeprefix('tml-')}"},
        timeout=60,
    )
    assert upload.status_code == 413, upload.text
