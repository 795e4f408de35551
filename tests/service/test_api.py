"""The API's edges against a real server with API keys: tenants, 401s, validation errors naming fields,
size limits, generated file names, pagination, the OpenAPI document, and the bind refusal."""

from __future__ import annotations

import json

import httpx
import pytest

from openrft.service.app import openapi_document
from openrft.service.routes_files import clean_filename
from tests.service.svc_helpers import ROOT, TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for this module (SQLite), with two keys and no worker: jobs stay queued."""
    root = tmp_path_factory.mktemp("api")
    service = Service(root / "data", f"sqlite:///{root / 'openrft.db'}")
    try:
        keys = service.create_key("alice"), service.create_key("bob")
        service.serve(workers=0, extra=("--max-upload-mb", "1"))
        yield service, keys
    finally:
        service.stop_all()


@pytest.fixture
def tenants(server, tmp_path):
    """Clients of the two tenants, and two files of the first."""
    service, (key_a, key_b) = server
    a = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key_a}"}, timeout=30)
    b = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key_b}"}, timeout=30)
    train = upload(a, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
    validation = upload(a, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4))
    yield a, b, train, validation
    a.close()
    b.close()


def test_keys_and_tenants(tenants, server):
    service = server[0]
    a, b, train, validation = tenants
    job = a.post("/v1/nova/jobs", json=tiny_recipe(train, validation)).json()
    assert job["status"] == "queued"

    missing = httpx.get(service.base_url + "/v1/fine_tuning/jobs")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = httpx.get(service.base_url + "/v1/fine_tuning/jobs", headers={"Authorization": "Bearer ork-wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"

    # the other tenant sees none of it, and cannot touch it
    assert b.get("/v1/fine_tuning/jobs").json()["data"] == []
    assert b.get("/v1/files").json()["data"] == []
    job_routes = [
        ("GET", "/v1/fine_tuning/jobs/{}"),
        ("GET", "/v1/fine_tuning/jobs/{}/events"),
        ("GET", "/v1/fine_tuning/jobs/{}/checkpoints"),
        ("POST", "/v1/fine_tuning/jobs/{}/cancel"),
        ("POST", "/v1/fine_tuning/jobs/{}/pause"),
        ("GET", "/v1/projects/p/locations/l/tuningJobs/{}"),
        ("POST", "/v1/projects/p/locations/l/tuningJobs/{}:cancel"),
    ]
    file_routes = [("GET", "/v1/files/{}"), ("GET", "/v1/files/{}/content"), ("DELETE", "/v1/files/{}")]
    cases = [(m, t, job["id"], "ftjob-doesnotexist") for m, t in job_routes]
    cases += [(m, t, train, "file-doesnotexist") for m, t in file_routes]
    for method, template, own, unknown in cases:
        response, reference = b.request(method, template.format(own)), b.request(method, template.format(unknown))
        assert response.status_code == reference.status_code == 404, (method, template, response.text)
        # indistinguishable from an id that does not exist: nothing of the other tenant's object shows
        assert response.text.replace(own, "ID") == reference.text.replace(unknown, "ID")
    using_a_file = b.post("/v1/nova/jobs", json=tiny_recipe(train, validation))
    assert using_a_file.status_code == 400 and using_a_file.json()["error"]["param"] == "run.data_s3_path"
    assert a.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["status"] == "queued"  # untouched

    # with keys configured, server paths are refused: data must be uploaded
    server_path = a.post("/v1/nova/jobs", json=tiny_recipe(str(TRAIN), validation))
    assert server_path.status_code == 400
    assert server_path.json()["error"]["param"] == "run.data_s3_path"


def test_submission_errors_name_the_fields(tenants, tmp_path):
    a, _, train, validation = tenants
    recipe = tiny_recipe(train, validation)
    recipe["training_config"]["trainer"]["clip_ratio_high"] = -1
    recipe["training_config"]["global_batch_size"] = 17
    error = a.post("/v1/nova/jobs", json=recipe).json()["error"]
    params = {p["param"] for p in error["problems"]}
    assert {"training_config.trainer.clip_ratio_high", "training_config.global_batch_size"} <= params

    lines = small_dataset(tmp_path / "bad.jsonl", TRAIN, 4).read_text().splitlines()
    lines[2] = json.dumps({"messages": [{"role": "robot", "content": "hi"}], "reference_answer": "1"})
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    bad_file = upload(a, tmp_path / "bad.jsonl")
    response = a.post("/v1/nova/jobs", json=tiny_recipe(bad_file, validation))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "run.data_s3_path" and error["code"] == "invalid_training_file"
    assert f"{bad_file}:3: messages[0].role" in error["message"] and "/" not in error["message"].split(":")[0]

    response = a.post("/v1/nova/jobs", content=b"run: [unclosed", headers={"content-type": "application/yaml"})
    assert response.status_code == 400 and "line 1" in response.json()["error"]["message"]
    response = a.post("/v1/fine_tuning/jobs", json={"model": "openrft-demo"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "training_file"


def test_files_limits_and_generated_names(tenants, server, tmp_path):
    service = server[0]
    a, _, train, _ = tenants
    evil = a.post("/v1/files", files={"file": ("../../escape.jsonl", b'{"a": 1}\n')}, data={"purpose": "fine-tune"})
    assert evil.status_code == 200
    assert evil.json()["filename"] == "escape.jsonl"
    assert clean_filename("..\\..\\a\x01b.jsonl") == "a_b.jsonl" and clean_filename("") == "upload.jsonl"
    stored = sorted(p.name for p in (service.data_dir / "files").iterdir())
    assert all(name.startswith("file-") for name in stored) and evil.json()["id"] in stored
    assert not list(service.data_dir.parent.glob("escape*"))

    bad_purpose = a.post("/v1/files", files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "assistants"})
    assert bad_purpose.status_code == 400 and bad_purpose.json()["error"]["param"] == "purpose"
    not_jsonl = a.post("/v1/files", files={"file": ("x.jsonl", b"{}\nnot json\n")}, data={"purpose": "fine-tune"})
    assert not_jsonl.status_code == 400 and "line 2" in not_jsonl.json()["error"]["message"]
    too_big = a.post("/v1/files", files={"file": ("big.jsonl", b"{}\n" * 400_000)}, data={"purpose": "fine-tune"})
    assert too_big.status_code == 413
    huge_json = a.post(
        "/v1/fine_tuning/jobs", content=b"{" + b" " * (2 << 20) + b"}", headers={"content-type": "application/json"}
    )
    assert huge_json.status_code == 413

    content = a.get(f"/v1/files/{train}/content")
    assert content.status_code == 200 and content.text == (tmp_path / "train.jsonl").read_text()
    assert a.delete(f"/v1/files/{train}").json() == {"id": train, "object": "file", "deleted": True}
    assert a.get(f"/v1/files/{train}").status_code == 404
    assert not (service.data_dir / "files" / train).exists()


def test_job_list_and_event_pagination(server, tmp_path):
    service = server[0]
    key = service.create_key("carol")  # a tenant of its own: no other test's jobs in its list
    a = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    train = upload(a, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
    validation = upload(a, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4))
    ids = [a.post("/v1/nova/jobs", json=tiny_recipe(train, validation, name=f"j{i}")).json()["id"] for i in range(5)]
    seen, after = [], None
    while True:
        page = a.get("/v1/fine_tuning/jobs", params={"limit": 2, **({"after": after} if after else {})}).json()
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert seen == ids[::-1]
    assert a.get("/v1/fine_tuning/jobs", params={"limit": 0}).status_code == 400
    assert a.get("/v1/fine_tuning/jobs", params={"after": "ftjob-unknown"}).status_code == 404

    job = ids[0]
    a.post(f"/v1/fine_tuning/jobs/{job}/pause")
    a.post(f"/v1/fine_tuning/jobs/{job}/resume")
    events = a.get(f"/v1/fine_tuning/jobs/{job}/events", params={"limit": 100}).json()["data"]
    assert [e["message"] for e in events][:2] == ["Job resumed: queued", "Job paused"]
    first = a.get(f"/v1/fine_tuning/jobs/{job}/events", params={"limit": 1}).json()
    rest = a.get(f"/v1/fine_tuning/jobs/{job}/events", params={"limit": 100, "after": first["data"][0]["id"]}).json()
    assert [e["id"] for e in first["data"] + rest["data"]] == [e["id"] for e in events]
    assert first["has_more"] and not rest["has_more"]
    assert a.get(f"/v1/fine_tuning/jobs/{job}/events", params={"after": "nope"}).status_code == 400


def test_served_openapi_document_is_the_committed_one(server):
    service = server[0]
    served = httpx.get(service.base_url + "/openapi.json").json()
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert served == committed == json.loads(json.dumps(openapi_document()))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_serve_refuses_to_bind_beyond_loopback_without_a_key(service):
    process = service.serve(host="0.0.0.0", wait=False)
    assert process.proc.wait(timeout=60) == 2
    assert "refusing to serve on 0.0.0.0 without an API key" in process.log.read_text()


def test_a_tenant_maps_lambdas_to_urls_only(tenants):
    a, _, train, validation = tenants
    recipe = tiny_recipe(train, validation)
    recipe["training_config"]["rollout"]["rewards"] = {"api_endpoint": {"lambda_arn": ""}}
    recipe["openrft"]["lambda_map"] = {"*": "/etc/passwd.py:lambda_handler"}
    error = a.post("/v1/nova/jobs", json=recipe).json()["error"]
    assert error["param"] == "openrft.lambda_map.*", error
    assert "map the ARN to an http(s) URL" in error["message"]
    recipe["openrft"]["lambda_map"] = {"*": "http://127.0.0.1:9/"}
    error = a.post("/v1/nova/jobs", json=recipe).json()["error"]  # a URL passes the map, then the outbound policy
    assert error["param"] == "training_config.rollout.rewards.endpoint", error
