"""A tenant configures nothing that runs on the server or reaches the operator's network or secrets (issue 49,
point 1): MCP stdio servers are the operator's (a tenant names a registered one), MCP URLs and generator URLs
obey the outbound policy one URL at a time, and the operator's credentials never reach a URL a tenant wrote.
Every route's dialect is tried: OpenAI, Nova and Vertex."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from openrft.service.store import Store
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status

pytestmark = pytest.mark.slow
SECRETS = {"OPENRFT_GENERATOR_API_KEY": "operator-generator-key", "MLFLOW_TRACKING_TOKEN": "operator-mlflow-token"}
STDIO = {"command": ["sh", "-c", "touch /tmp/openrft-pwned"], "env": {"LD_PRELOAD": "/tmp/x.so"}, "cwd": "/"}


def start(root, name: str, env: dict[str, str], extra: tuple[str, ...], workers: int):
    service = Service(root / name, f"sqlite:///{root / name / 'openrft.db'}", env=env)
    key = service.create_key("tenant")
    service.serve(workers=workers, extra=extra)
    client = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return service, client


@pytest.fixture(scope="module")
def tenant(tmp_path_factory):
    """A server with API keys and an operator's MCP registry; no worker (these jobs are only submitted)."""
    root = tmp_path_factory.mktemp("tenant-tools")
    registry = root / "mcp.yaml"
    registry.write_text(json.dumps({"clock": {"command": ["python", "-m", "mcp_server_time"], "cwd": "."}}))
    service, client = start(root, "refusing", {}, ("--mcp-servers", str(registry)), workers=0)
    try:
        files = [
            upload(client, small_dataset(root / "train.jsonl", TRAIN, 8)),
            upload(client, small_dataset(root / "validation.jsonl", VALIDATION, 4)),
        ]
        yield service, client, files, root
    finally:
        client.close()
        service.stop_all()


def nova(files, openrft: dict) -> tuple[str, dict]:
    recipe = tiny_recipe(*files)
    recipe["openrft"].update(openrft)
    return "/v1/nova/jobs", recipe


def openai(files, openrft: dict) -> tuple[str, dict]:
    grader = {"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "4"}
    body = {
        "model": "openrft-demo",
        "training_file": files[0],
        "validation_file": files[1],
        "method": {"type": "reinforcement", "reinforcement": {"grader": {**grader, "operation": "eq"}}},
        "openrft": openrft,
    }
    return "/v1/fine_tuning/jobs", body


def vertex(files, openrft: dict) -> tuple[str, dict]:
    reward = {
        "rewardName": "correct",
        "parseResponseConfig": {"parseType": "IDENTITY"},
        "stringMatchRewardScorer": {
            "correctAnswerReward": 1,
            "wrongAnswerReward": 0,
            "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.answer}}"},
        },
    }
    body = {
        "baseModel": "openrft-demo",
        "reinforcementTuningSpec": {
            "trainingDatasetUri": files[0],
            "validationDatasetUri": files[1],
            "hyperParameters": {"stepCount": 1, "batchSize": 4, "samplesPerPrompt": 4},
            "singleRewardConfig": reward,
        },
        "openrft": openrft,
    }
    return "/v1/projects/p/locations/l/tuningJobs", body


ROUTES = [nova, openai, vertex]


def refused(response: httpx.Response) -> tuple[str, str]:
    """(field, message) of an error in the OpenAI shape or Google's (fieldViolations)."""
    error = response.json()["error"]
    if "param" in error:
        return error["param"], error["message"]
    violations = [v for d in error.get("details", []) for v in d.get("fieldViolations", [])]
    return violations[0]["field"], error["message"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_tenant_may_not_define_an_mcp_stdio_server(tenant, route):
    _, client, files, _ = tenant
    path, body = route(files, {"tools": {"mcp_servers": {"x": STDIO}}})
    response = client.post(path, json=body)
    assert response.status_code == 403, response.text
    field, message = refused(response)
    assert field == "openrft.tools.mcp_servers.x.command", response.text
    assert "operator" in message and "MCP stdio server" in message


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/mcp", "http://0x7f000001:9/mcp", "http://169.254.169.254/mcp", "http://[::1]:9/mcp"],
)
def test_mcp_urls_obey_the_outbound_policy(tenant, route, url):
    _, client, files, _ = tenant
    path, body = route(files, {"tools": {"mcp_servers": {"x": {"url": url}}}})
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    field, message = refused(response)
    assert field == "openrft.tools.mcp_servers.x.url" and "internal addresses" in message, response.text


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("file:///etc/passwd", "not an http(s) URL"),
        ("https://example.com/v1,http://127.0.0.1:9/v1", "not one URL"),
        (["https://example.com/v1", "http://[::1]:9/v1"], "internal addresses"),
    ],
)
def test_generator_and_mcp_urls_are_one_url_each_and_each_is_checked(tenant, value, says):
    _, client, files, _ = tenant
    for openrft in ({"generator_base_url": value}, {"tools": {"mcp_servers": {"x": {"url": value}}}}):
        if isinstance(value, list) and "tools" in openrft:
            continue  # an MCP server has one url
        path, body = nova(files, openrft)
        response = client.post(path, json=body)
        assert response.status_code == 400, response.text
        assert says in response.json()["error"]["message"], response.text


def test_a_tenant_names_a_registered_mcp_server(tenant):
    service, client, files, _ = tenant
    path, body = nova(files, {"tools": {"mcp_servers": {"t": {"registered": "nope"}}}})
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "openrft.tools.mcp_servers.t.registered" and "registered: clock" in error["message"]

    path, body = nova(files, {"tools": {"mcp_servers": {"t": {"registered": "clock", "timeout_s": 5}}}})
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    store = Store.open(service.database_url, run_migrations=False)
    try:
        stored = store.get_job(None, response.json()["id"]).spec["tools"]["mcp_servers"]["t"]
    finally:
        store.close()
    assert stored["command"] == ["python", "-m", "mcp_server_time"] and stored["registered"] is None
    assert stored["timeout_s"] == 5 and stored["cwd"] == str(service.data_dir.parent.resolve())


class _Capture(BaseHTTPRequestHandler):
    """Records every request's headers; answers 400 (MLflow's client does not retry it)."""

    seen: ClassVar[list[dict[str, str]]] = []

    def _answer(self):
        _Capture.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b'{"error_code": "INVALID_PARAMETER_VALUE", "message": "no"}'
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def test_the_operators_credentials_never_reach_a_tenants_url(tmp_path):
    """A tenant's generator and MLflow URLs are called (the operator allows private URLs here, so that they can
    be on 127.0.0.1), and not one request carries the operator's generator key or MLflow token."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    service, client = start(tmp_path, "secrets", dict(SECRETS), ("--allow-private-urls",), workers=1)
    try:
        files = [
            upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 8)),
            upload(client, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4)),
        ]
        for where, name, value in (("openrft", "generator_base_url", url + "/v1"), ("run", "mlflow_tracking_uri", url)):
            _Capture.seen.clear()
            path, body = nova(files, {})
            body[where][name] = value
            created = client.post(path, json=body)
            assert created.status_code == 200, created.text
            job = wait_status(client, created.json()["id"], ("failed", "succeeded"), timeout=240)
            assert _Capture.seen, (name, job)  # the tenant's URL was called
            sent = json.dumps(_Capture.seen)
            assert not any(secret in sent for secret in SECRETS.values()), (name, _Capture.seen)
    finally:
        client.close()
        service.stop_all()
        httpd.shutdown()
