"""The outbound policy holds when a tenant's job calls out, not only when the job is submitted.

A host name a tenant wrote answers a public address when the job is submitted and 127.0.0.1 when the job calls
it (DNS rebinding): the submission check passes, and every kind of call out refuses at call time, the server on
127.0.0.1 never reached. The resolver is ``socket.getaddrinfo`` answering from a table for the test's names
(every other name resolved as usual); servers are real, on 127.0.0.1. In the operator's own jobs (no policy in
the process) the same names reach 127.0.0.1, and the operator's judge is reached in a tenant's job too.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from openrft.calls.endpoints import async_client, sync_client
from openrft.calls.outbound import POLICY_ENV, OutboundPolicy, OutboundRefused, refusal
from openrft.spec.call_options import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.results import CallContext
from openrft.tools.runners import ToolBox
from tests.rewards.chat_server import ChatServer
from tests.rewards.helpers import FAST_REMOTE, example, score, scores

PUBLIC = "93.184.216.34"  # what the name answers at submission (never connected to: the test only submits)
REAL_GETADDRINFO = socket.getaddrinfo


class Hits(BaseHTTPRequestHandler):
    """Answers every request with a JSON body fit for each caller here; counts what reached it."""

    seen: ClassVar[list[str]] = []

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        Hits.seen.append(f"{self.server.server_address[0]} {self.command} {self.path}")
        if isinstance(body, list):  # a Nova reward endpoint's batch
            answer = [{"id": s["id"], "aggregate_reward_score": 0.5} for s in body]
        elif self.path.startswith("/redirect"):
            self.send_response(307)
            self.send_header("location", self.headers["x-location"])
            self.send_header("content-length", "0")
            self.end_headers()
            return
        else:
            answer = {"content": "ok", "data": [{"id": "m"}]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(host: str = "127.0.0.1", port: int = 0) -> int:
        httpd = ThreadingHTTPServer((host, port), Hits)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd.server_address[1]

    Hits.seen = []
    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def dns(monkeypatch):
    """``socket.getaddrinfo`` answering the test's names from a table: each name's answers in turn (the last
    one kept), every other name as the system resolves it. Returns the table and the lookups made."""
    table: dict[str, list[str]] = {}
    lookups: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in table:
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        lookups.append(name)
        answers = table[name]
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        address = answers.pop(0) if len(answers) > 1 else answers[0]
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table, lookups


@pytest.fixture
def tenant(monkeypatch):
    """This process as a tenant's job process: what JobRunner sets (``outbound.tenant_job``)."""
    monkeypatch.setenv(POLICY_ENV, "public")


def rebinding(dns, name: str = "rebind.test") -> str:
    """``name`` answers a public address at the submission check, then 127.0.0.1 at every call."""
    dns[0][name] = [PUBLIC, "127.0.0.1"]
    return name


def submitted(url: str) -> str:
    assert refusal(url, allow_private=False) is None  # the submission check passes: the name was public then
    return url


def test_a_reward_endpoint_rebound_to_loopback_is_refused_at_call_time(serve, dns, tenant):
    port = serve()
    url = submitted(f"http://{rebinding(dns)}:{port}/")
    outcome = score({"type": "nova_lambda", "endpoint": url}, ["a"], remote=FAST_REMOTE)[0]
    assert outcome.error_kind == "server_error" and "127.0.0.1" in outcome.error_message, outcome
    assert "resolved, when the call was made" in outcome.error_message
    assert Hits.seen == []
    assert dns[1] == ["rebind.test", "rebind.test"]  # the submission's lookup, then one for the call (no retry)


def test_an_http_tool_rebound_to_loopback_is_refused_and_the_model_is_told(serve, dns, tenant):
    port = serve()
    url = submitted(f"http://{rebinding(dns)}:{port}/tool")
    spec = ToolsSpec.model_validate({"functions": {"calc": {"type": "http", "url": url}}})

    async def call():
        box = await ToolBox(spec, SandboxSpec()).start()
        try:
            context = CallContext(example_id="e1", episode_id="ep1", turn=1, messages=[])
            return await box.call("calc", {}, "c1", {"calc"}, context)
        finally:
            await box.aclose()

    result = asyncio.run(call())
    assert result.error_kind == "server_error" and "127.0.0.1" in result.content, result
    assert Hits.seen == []


def test_an_mcp_server_rebound_to_loopback_is_refused_at_call_time(dns, tenant):
    from openrft.tools.mcp import add_mcp_tools
    from tests.tools.test_mcp import row, serving

    with serving() as (url, _):
        port = url.rsplit(":", 1)[1].split("/")[0]
        url = submitted(f"http://{rebinding(dns)}:{port}/mcp")
        with pytest.raises(Exception, match=r"cannot connect: OutboundRefused: rebind\.test resolved, when the call"):
            add_mcp_tools(ToolsSpec.model_validate({"mcp_servers": {"remote": {"url": url}}}), [row()])


def test_an_mcp_server_on_loopback_is_reached_in_the_operators_own_job():
    """(By its address: the SDK's server refuses a Host header other than its own, against rebinding.)"""
    from openrft.tools.mcp import add_mcp_tools
    from tests.tools.test_mcp import row, serving

    with serving() as (url, _):
        found = add_mcp_tools(ToolsSpec.model_validate({"mcp_servers": {"remote": {"url": url}}}), [row()])
    assert "add" in found


def test_a_generation_server_rebound_to_loopback_is_refused_at_call_time(serve, dns, tenant, tmp_path):
    from openrft.rollout.remote import GenerationServerError, RemoteGenerator
    from openrft.spec.job import LoraSpec

    port = serve()
    url = submitted(f"http://{rebinding(dns)}:{port}")
    generator = RemoteGenerator(
        url, adapter_dir=tmp_path, lora=LoraSpec(rank=4, alpha=16), base_model="m", eos_token_ids=[0], retries=2
    )
    with pytest.raises(GenerationServerError, match=r"is not called: rebind\.test resolved, when the call was made"):
        generator._base_name()
    generator.close()
    assert Hits.seen == []


def test_an_mlflow_server_rebound_to_loopback_is_refused_at_call_time(serve, dns, tenant, tmp_path):
    pytest.importorskip("mlflow")
    from openrft.engine.mlflow_tracking import MlflowError, MlflowTracker
    from openrft.spec.job import JobSpec

    port = serve()
    url = submitted(f"http://{rebinding(dns)}:{port}")
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {"train": "train.jsonl"},
            "training": {"prompts_per_step": 2, "total_steps": 1},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "tracking": {"mlflow_tracking_uri": url},
        }
    )
    with pytest.raises(MlflowError, match=r"rebind\.test resolved, when the call was made, to 127\.0\.0\.1"):
        MlflowTracker.start(spec, tmp_path, resume=False, on_event=lambda *_: None)
    assert Hits.seen == []


def test_mlflows_own_sessions_connect_only_to_checked_addresses(serve, dns, tenant, monkeypatch):
    """Past the reachability probe, MLflow's client calls with requests sessions of its own: those are checked
    too (``transport.use_for_mlflow``), and the operator's own jobs keep MLflow as it is, also in a process that
    ran a tenant's job before (a test process does)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from mlflow.utils import request_utils

    from openrft.calls.transport import use_for_mlflow

    adapter = request_utils.TCPKeepAliveHTTPAdapter
    original = getattr(adapter, "openrft_base", adapter)  # MLflow's own, whatever a test before installed
    port = serve()
    dns[0]["inside.test"] = ["127.0.0.1"]
    try:
        use_for_mlflow()
        with pytest.raises(Exception, match=r"inside\.test resolved, when the call was made, to 127\.0\.0\.1"):
            MlflowClient(tracking_uri=f"http://inside.test:{port}").get_experiment_by_name("x")
        assert Hits.seen == []
        monkeypatch.delenv(POLICY_ENV)  # then an operator's job in this process: MLflow's own adapter again
        use_for_mlflow()
        assert request_utils.TCPKeepAliveHTTPAdapter is original
    finally:
        request_utils.TCPKeepAliveHTTPAdapter = original
        request_utils._cached_get_request_session.cache_clear()


def test_the_operators_judge_is_reached_from_a_tenants_job(dns, tenant, monkeypatch):
    """judge.base_url is the operator's (tenants cannot set it): a loopback judge serves tenants' jobs."""

    class Seven:
        def reply(self, messages, max_tokens):
            return "7"

    grader = {
        "type": "openai_grader",
        "grader": {
            "type": "score_model",
            "name": "judge",
            "model": "judge",
            "range": [0, 10],
            "input": [{"role": "user", "content": "{{item.question}}"}],
        },
    }
    with ChatServer(Seven()) as chat:
        monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", chat.base_url)
        outcome = score(grader, ["x"], example(question="q?"))[0]
    assert outcome.ok and outcome.score == 7.0, outcome


def test_the_operators_own_job_reaches_loopback_by_any_name(serve, dns):
    port = serve()
    dns[0]["inside.test"] = ["127.0.0.1"]
    assert scores({"type": "nova_lambda", "endpoint": f"http://inside.test:{port}/"}, ["a"]) == [0.5]
    assert len(Hits.seen) == 1


class LoopbackTwoIsPublic(OutboundPolicy):
    """The policy with 127.0.0.1 its only internal address, so that a test can stand a "public" server on
    127.0.0.2 (the transport under test is the real one; only the decision of what is internal is the test's)."""

    def refuses(self, address) -> bool:
        return str(address) == "127.0.0.1"


def test_the_connection_goes_to_the_address_that_was_checked_never_a_second_lookup(serve, dns):
    """A name answering 127.0.0.2 (allowed here) at the check and 127.0.0.1 right after: the one lookup's address
    is the one connected to, so the call lands on 127.0.0.2 whatever the name answers next."""
    port = serve("127.0.0.2")
    serve("127.0.0.1", port)
    dns[0]["flip.test"] = ["127.0.0.2", "127.0.0.1"]
    with sync_client(policy=LoopbackTwoIsPublic(), timeout=5) as client:
        assert client.get(f"http://flip.test:{port}/x").status_code == 200
    assert Hits.seen == ["127.0.0.2 GET /x"]
    assert dns[1] == ["flip.test"]


def test_a_redirect_to_a_private_address_is_refused(serve, dns):
    """A public endpoint (127.0.0.2 here) answering 307 to a name of a private address: not followed, the
    private server never reached; the same holds for the async client."""
    port = serve("127.0.0.2")
    serve("127.0.0.1", port)
    dns[0]["inside.test"] = ["127.0.0.1"]
    for target in (f"http://inside.test:{port}/secret", f"http://127.0.0.1:{port}/secret"):
        headers = {"x-location": target}
        refused = pytest.raises((OutboundRefused, httpx.TransportError), match=r"127\.0\.0\.1")
        with sync_client(policy=LoopbackTwoIsPublic(), timeout=5) as client, refused:
            client.get(f"http://127.0.0.2:{port}/redirect", headers=headers)

        async def follow(headers=headers):
            async with async_client(policy=LoopbackTwoIsPublic(), timeout=5) as client:
                await client.get(f"http://127.0.0.2:{port}/redirect", headers=headers)

        with pytest.raises((OutboundRefused, httpx.TransportError), match=r"127\.0\.0\.1"):
            asyncio.run(follow())
    assert all(hit.startswith("127.0.0.2 ") for hit in Hits.seen) and len(Hits.seen) == 4


def test_a_name_that_does_not_resolve_at_call_time_is_refused_naming_it(dns):
    dns[0]["gone.test"] = []
    with pytest.raises(OutboundRefused, match=r"gone\.test does not resolve"):
        OutboundPolicy().connect_addresses("gone.test", 80)
    with pytest.raises(OutboundRefused, match=r"169\.254\.169\.254"):
        OutboundPolicy().connect_addresses("169.254.169.254", 80)
    assert OutboundPolicy().connect_addresses(PUBLIC, 443) == [PUBLIC]


def test_a_tenants_job_process_applies_the_policy_its_submission_did(tmp_path, monkeypatch):
    """The worker tells the job process whether the operator allows private URLs; the job process marks itself
    (``tenant_job``) and every client it makes then checks, or not (the operator's own jobs: never)."""
    from openrft.calls.outbound import process_policy, tenant_job
    from openrft.service.config import ServiceConfig
    from openrft.service.launchers import job_args

    config = ServiceConfig.build(tmp_path)
    assert "--allow-private-urls" not in job_args("ftjob-x", 1, config)
    config.allow_private_urls = True
    assert "--allow-private-urls" in job_args("ftjob-x", 1, config)
    environ: dict[str, str] = {}
    tenant_job(environ, allow_private=False)
    monkeypatch.setenv(POLICY_ENV, environ[POLICY_ENV])
    assert isinstance(process_policy(), OutboundPolicy)
    tenant_job(environ, allow_private=True)
    assert POLICY_ENV not in environ
    monkeypatch.delenv(POLICY_ENV)
    assert process_policy() is None


def test_the_service_reads_a_tenants_dataset_url_only_at_a_checked_address(tmp_path, serve, dns):
    """Validating a tenant's job, the service itself reads its dataset URL (in its own process, where the
    operator's calls are unchecked): rebound to 127.0.0.1 after the submission check, it is refused, by field."""
    from fastapi.testclient import TestClient

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store
    from tests.service.svc_helpers import VALIDATION, small_dataset, tiny_recipe

    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    try:
        _, key = store.create_key("alice")
        client = TestClient(create_app(config, store), headers={"Authorization": f"Bearer {key}"})
        validation = small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4)
        answer = client.post(
            "/v1/files", files={"file": ("v.jsonl", validation.read_bytes())}, data={"purpose": "fine-tune"}
        )
        port = serve()
        recipe = tiny_recipe(f"http://{rebinding(dns)}:{port}/train.jsonl", answer.json()["id"])
        response = client.post("/v1/nova/jobs", json=recipe)
    finally:
        store.close()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "run.data_s3_path" and "resolved, when the call was made, to 127.0.0.1" in error["message"]
    assert Hits.seen == []


def test_the_operators_own_dataset_url_on_loopback_is_read(serve, dns):
    from openrft.storage import read_bytes

    port = serve()
    dns[0]["inside.test"] = ["127.0.0.1"]
    assert b'"content": "ok"' in read_bytes(f"http://inside.test:{port}/train.jsonl")
    assert Hits.seen == ["127.0.0.1 GET /train.jsonl"]


def test_a_tenants_grader_endpoint_called_by_the_service_is_checked_at_call_time(tmp_path, serve, dns):
    """Vertex's reward validation calls a tenant's Cloud Run scorer from the API server's own process: a name
    rebound to 127.0.0.1 after the request's check is refused when the call is made; the server never reached."""
    from fastapi.testclient import TestClient

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    port = serve()
    body = {
        "singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": f"http://{rebinding(dns)}:{port}/score"}},
        "example": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        "sampleResponse": {"parts": [{"text": "x"}]},
    }
    try:
        _, key = store.create_key("alice")
        with TestClient(create_app(config, store), headers={"Authorization": f"Bearer {key}"}) as client:
            response = client.post("/v1/projects/p/locations/l/tuningJobs:validateReinforcementTuningReward", json=body)
    finally:
        store.close()
    assert "resolved, when the call was made, to 127.0.0.1" in response.text, response.text
    assert Hits.seen == []


def test_an_agent_endpoint_rebound_to_loopback_is_refused_at_call_time(dns, tenant):
    """A job's agent (``rollout.agent.url``) is POSTed each trajectory: rebound to 127.0.0.1, the call is refused
    and the trajectory dropped as an ``agent_error`` naming the address; the entrypoint never reached."""
    from tests.tools.agent_harness import AgentRun
    from tests.tools.scripted import ScriptedGenerator, question, tool_tokenizer

    tokenizer = tool_tokenizer()
    policy = ScriptedGenerator(tokenizer, lambda context: "5")
    with AgentRun(tokenizer, policy, lambda request: "5", [tokenizer.eos_token_id], max_retries=0) as run:
        port = run.entrypoint.server_address[1]
        run.service.spec = run.spec.model_copy(update={"url": submitted(f"http://{rebinding(dns)}:{port}/")})
        (group,) = run.run([question(2, 3)])
        requests = list(run.entrypoint.requests)
    kind, message = group[0].metadata["tool_failure"]
    assert kind == "agent_error" and "resolved, when the call was made, to 127.0.0.1" in message, message
    assert requests == []


def _certificate(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed certificate for ``name`` (its own authority): (certificate file, key file)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_file), str(key_file)


def test_tls_to_the_checked_address_verifies_the_certificate_against_the_name(tmp_path, dns):
    """Connected to the checked address, not the name: the TLS handshake still names the host (SNI) and checks the
    certificate against it, and the request's Host header is the URL's."""
    import ssl

    cert, key = _certificate(tmp_path, "tls.test")
    httpd = ThreadingHTTPServer(("127.0.0.2", 0), Hits)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_context.sni_callback = lambda _socket, name, _context: names.append(name)
    httpd.socket = server_context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Hits.seen = []
    dns[0]["tls.test"] = ["127.0.0.2"]
    dns[0]["other.test"] = ["127.0.0.2"]
    trusted = ssl.create_default_context(cafile=cert)
    try:
        with sync_client(policy=LoopbackTwoIsPublic(), verify=trusted, timeout=5) as client:
            assert client.get(f"https://tls.test:{httpd.server_address[1]}/x").status_code == 200
            with pytest.raises(httpx.ConnectError, match=r"certificate|hostname"):
                client.get(f"https://other.test:{httpd.server_address[1]}/x")  # same address, another name
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert names[0] == "tls.test" and Hits.seen == ["127.0.0.2 GET /x"]
