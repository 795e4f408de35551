"""Bad input is refused with a 400 that names the bound, never a 500 or a job that fails late; the
service stays available (bounded grader pool, keep-alive after a 500, no partial files on a full disk)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time

import httpx
import pytest

from openrft.service.errors import ApiError
from openrft.service.graders import WorkPool
from openrft.service.routes_files import _store_upload
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, app_in_thread, small_dataset, upload

H = "method.reinforcement.hyperparameters"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server with two tenants and no worker: jobs stay queued. Alice may name s3://team-a/shared."""
    root = tmp_path_factory.mktemp("robust")
    service = Service(root / "data", f"sqlite:///{root / 'openrft.db'}")
    try:
        keys = service.create_key("alice"), service.create_key("bob")
        service.serve(workers=0, extra=("--allow-store-prefix", "alice=s3://team-a/shared"))
        client = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {keys[0]}"}, timeout=60)
        train = upload(client, small_dataset(root / "train.jsonl", TRAIN, 16))
        validation = upload(client, small_dataset(root / "validation.jsonl", VALIDATION, 4))
        service.keys = keys
        yield service, client, (train, validation)
        client.close()
    finally:
        service.stop_all()


def openai_job(files, hyperparameters=None, openrft=None) -> dict:
    grader = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "4"}
    return {
        "model": "openrft-demo",
        "training_file": files[0],
        "validation_file": files[1],
        "method": {
            "type": "reinforcement",
            "reinforcement": {"grader": {**grader, "operation": "eq"}, "hyperparameters": hyperparameters or {}},
        },
        "openrft": openrft or {},
    }


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        (f"{H}.learning_rate_multiplier", 1e30, "[0, 10]"),
        ("openrft.max_new_tokens", 10**9, "[1, 32768]"),
        ("openrft.lora_rank", 10**6, "[1, 512]"),
        ("openrft.threads", 10**6, "[1, 1024]"),
        ("openrft.replicas", 10**6, "[1, 64]"),
        ("openrft.generation_replicas", 10**6, "[1, 64]"),
        ("openrft.max_length", 10**9, "[2, 131072]"),
        ("openrft.micro_batch_tokens", 10**12, "[1, 1048576]"),
    ],
)
def test_numbers_past_their_bounds_are_refused_at_submission(server, field, value, allowed):
    _, client, files = server
    section, name = field.rsplit(".", 1)
    job = openai_job(files, **({"hyperparameters": {name: value}} if section == H else {"openrft": {name: value}}))
    response = client.post("/v1/fine_tuning/jobs", json=job)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and f"is outside {allowed}" in error["message"] and repr(value) in error["message"]


def test_files_with_no_records_or_too_deep_are_refused_and_leave_nothing(server, tmp_path):
    service, client, _ = server
    before = sorted(p.name for p in (service.data_dir / "files").iterdir())
    deep = "[" * 100_000 + "]" * 100_000
    for name, content in (("blank.jsonl", " \n\t\n  \n"), ("deep.jsonl", deep + "\n")):
        response = client.post("/v1/files", files={"file": (name, content.encode())}, data={"purpose": "fine-tune"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_file_format"
    assert sorted(p.name for p in (service.data_dir / "files").iterdir()) == before


def test_deeply_nested_and_alias_bomb_documents_get_400_naming_the_bound(server):
    _, client, files = server
    deep = '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = client.post("/v1/fine_tuning/jobs", content=deep, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text

    nested = openai_job(files)
    for _ in range(70):
        nested = {"x": nested}
    response = client.post("/v1/fine_tuning/alpha/graders/validate", json={"grader": nested})
    assert response.status_code == 400 and "deeper than 64 levels" in response.json()["error"]["message"]

    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]")
    bomb = "\n".join(lines) + "\nrun: {model_name_or_path: openrft-demo}\n"
    assert len(bomb) < 1000
    started = time.monotonic()
    response = client.post("/v1/nova/jobs", content=bomb, headers={"content-type": "application/yaml"})
    assert response.status_code == 400, response.text
    assert "more than 200,000 values" in response.json()["error"]["message"]
    assert time.monotonic() - started < 30  # refused without expanding 9**10 values
    assert client.get("/health").status_code == 200


def test_query_parameters_out_of_range_are_400(server):
    _, client, files = server
    job = client.post("/v1/fine_tuning/jobs", json=openai_job(files)).json()["id"]
    for url in (
        f"/v1/dashboard/jobs/{job}?after_event=99999999999999999999999",
        f"/v1/fine_tuning/jobs/{job}/events?after=ftevent-99999999999999999999999",
        f"/v1/fine_tuning/jobs/{job}/events?limit=99999999999999999999999",
    ):
        response = client.get(url)
        assert response.status_code == 400, (url, response.text)


def test_a_500_leaves_the_keep_alive_connection_usable(tmp_path):
    """An app with a route that fails, served by uvicorn: the next request on the same connection is answered."""

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'db.sqlite'}")
    app = create_app(config, Store.open(config.database_url))

    @app.get("/boom")
    def boom():
        raise RuntimeError("a bug")

    with app_in_thread(app) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        answers = []
        for path in ("/boom", "/health"):
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answers.append(_read_response(conn))
    assert answers[0][0] == 500 and json.loads(answers[0][1])["error"]["code"] == "server_error"
    assert answers[1][0] == 200 and json.loads(answers[1][1])["status"] == "ok"


def _read_response(conn: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(head.split(b" ")[1]), body


def test_a_full_disk_gives_507_and_leaves_no_partial_file(tmp_path):
    target = tmp_path / "file-abc"
    os.symlink("/dev/full", tmp_path / ".file-abc.partial")  # every write there fails with ENOSPC
    source = tmp_path / "upload.jsonl"
    source.write_text('{"a": 1}\n' * 1000)
    with source.open("rb") as f, pytest.raises(ApiError) as caught:
        _store_upload(f, target)
    assert caught.value.status == 507 and caught.value.code == "insufficient_storage"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["upload.jsonl"]


def test_the_work_pool_answers_429_past_its_queue():
    release = threading.Event()

    async def go():
        pool = WorkPool(workers=1, queue_limit=1)
        running = [asyncio.create_task(pool.run(release.wait, 30)) for _ in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(ApiError) as caught:
            await pool.run(release.wait, 30)
        release.set()
        assert await asyncio.gather(*running) == [True, True]
        assert await pool.run(lambda: 7) == 7  # free again
        pool.shutdown()
        return caught.value

    error = asyncio.run(go())
    assert error.status == 429 and error.headers == {"Retry-After": "5"}


@pytest.mark.parametrize(
    ("key", "field", "location", "allowed"),
    [
        (0, "data_s3_path", "s3://team-b/train.jsonl", False),
        (0, "data_s3_path", "s3://team-a/shared-not/train.jsonl", False),  # a prefix is whole path parts
        (0, "data_s3_path", "s3://team-a/shared/../private/train.jsonl", False),
        (0, "data_s3_path", "gs://team-a/shared/train.jsonl", False),
        (0, "data_s3_path", "hf://datasets/org/name/train.jsonl", False),
        (1, "output_s3_path", "s3://team-a/shared/out", False),  # bob was allowed nothing
        (0, "output_s3_path", "s3://team-a/shared/out", True),
    ],
)
def test_object_store_locations_are_refused_outside_the_prefixes_of_the_key(server, key, field, location, allowed):
    """The service reaches object stores with its own credentials: a tenant names only what the operator allowed."""
    from tests.service.svc_helpers import tiny_recipe

    service, _client, files = server
    recipe = tiny_recipe(*files)
    recipe["run"][field] = location
    headers = {"Authorization": f"Bearer {service.keys[key]}"}
    with httpx.Client(base_url=service.base_url, headers=headers, timeout=60) as tenant:
        if key == 1:  # bob's own files
            recipe["run"]["data_s3_path"] = upload(tenant, small_dataset(service.data_dir / "b.jsonl", TRAIN, 16))
            recipe["run"]["validation_data_s3_path"] = recipe["run"]["data_s3_path"]
        response = tenant.post("/v1/nova/jobs", json=recipe)
        if allowed:
            assert response.status_code == 200, response.text
            tenant.post(f"/v1/fine_tuning/jobs/{response.json()['id']}/cancel")
            return
        assert response.status_code == 403, response.text
        error = response.json()["error"]
        assert error["param"] == f"run.{field}", error
        if ".." not in location:
            assert "--allow-store-prefix" in error["message"], error
            assert ("allowed: s3://team-a/shared;" if key == 0 else "allowed: none;") in error["message"]
