"""Tenants against the service (issue 14): no secret reaches a grader, a tenant cannot weaken the sandbox or
name another tenant's resources, and the service fetches no internal URL for a tenant."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from openrft.calls.outbound import refusal
from tests.rewards.helpers import SECRET_PROBE, SECRETS, require_bwrap
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status

PROBE = {"type": "python", "name": "probe", "source": SECRET_PROBE}
RUN = "/v1/fine_tuning/alpha/graders/run"
VALIDATE = "/v1/fine_tuning/alpha/graders/validate"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with two tenants and one worker, whose environment holds the secrets."""
    require_bwrap()
    root = tmp_path_factory.mktemp("security")
    service = Service(root / "data", f"sqlite:///{root / 'openrft.db'}", env=dict(SECRETS))
    try:
        keys = service.create_key("alice"), service.create_key("bob")
        service.serve(workers=1)
        clients = [
            httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {k}"}, timeout=60) for k in keys
        ]
        yield service, clients, root
        for client in clients:
            client.close()
    finally:
        service.stop_all()


class _Counting(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self):
        _Counting.hits.append(self.path)
        body = b'{"messages": [{"role": "user", "content": "1+1?"}], "reference_answer": "2"}\n' * 8
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def internal_url():
    """An HTTP server on 127.0.0.1 standing for an internal service; it counts the requests it gets."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_graders_run_gives_user_code_no_secret_of_the_server(server):
    alice = server[1][0]
    response = alice.post(RUN, json={"grader": PROBE, "model_sample": "x", "item": {}})
    assert response.status_code == 200, response.text
    result = response.json()
    assert not any(v for k, v in result["metadata"]["errors"].items() if not k.endswith(("_details", "_type")))
    assert result["reward"] == 0.25  # 1.0: the grader read a secret of the server


@pytest.mark.parametrize(
    ("grader", "status", "param"),
    [
        ({"function": {"type": "openai_grader", "grader": PROBE}, "sandbox": {"isolation": "weak"}}, 403, "isolation"),
        ({"function": {"type": "openai_grader", "grader": PROBE}, "sandbox": {"python_paths": ["/etc"]}}, 403, "paths"),
        ({"type": "callable", "target": "builtins:print"}, 403, "grader.target"),
        ({"type": "nova_lambda", "endpoint": "/etc/reward.py:lambda_handler"}, 400, "grader.endpoint"),
        ({"type": "nova_lambda", "endpoint": "arn:aws:lambda:us-east-1:123456789012:function:f"}, 403, "endpoint"),
        ({"type": "callable", "target": "sys:exit", "sandboxed": True}, 403, "grader.target"),
        ({"function": {"type": "callable", "target": "os:getenv"}}, 403, "grader.function.target"),
        (
            {"function": {"type": "preset", "name": "exact_match"}, "judge": {"base_url": "http://x/v1"}},
            403,
            "base_url",
        ),
        ({"function": {"type": "preset", "name": "exact_match"}, "remote": {"api_key_env": "HOME"}}, 403, "key_env"),
        ({"function": {"type": "openai_grader", "grader": PROBE}, "sandbox": {"memory_limit_mb": 10**6}}, 400, "mb"),
        ({"function": {"type": "openai_grader", "grader": PROBE}, "sandbox": {"time_limit_s": 1000}}, 400, "limit_s"),
    ],
)
def test_a_tenant_cannot_set_what_the_operator_sets(server, grader, status, param):
    alice = server[1][0]
    for path, body in ((RUN, {"grader": grader, "model_sample": "x"}), (VALIDATE, {"grader": grader})):
        response = alice.post(path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"].startswith("grader") and error["param"].endswith(param), error
        if status == 400:
            assert "above the service's limit" in error["message"] or "file on the server" in error["message"]


def test_reward_endpoints_and_data_urls_may_not_reach_internal_addresses(server, internal_url, tmp_path):
    alice = server[1][0]
    validate = "/v1/projects/p/locations/l/tuningJobs:validateReinforcementTuningReward"
    body = {
        "singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": internal_url + "/score"}},
        "example": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        "sampleResponse": {"parts": [{"text": "x"}]},
    }
    response = alice.post(validate, json=body)
    assert response.status_code == 400 and "127.0.0.1" in response.json()["error"]["message"], response.text

    train = upload(alice, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
    validation = upload(alice, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4))
    cases = {
        "run.data_s3_path": lambda r: r["run"].update(data_s3_path=internal_url + "/train.jsonl"),
        "run.validation_data_s3_path": lambda r: r["run"].update(validation_data_s3_path="http://169.254.169.254/x"),
        "openrft.generator_base_url": lambda r: r["openrft"].update(generator_base_url=internal_url + "/v1"),
        "run.mlflow_tracking_uri": lambda r: r["run"].update(mlflow_tracking_uri="file:///etc/openrft-mlruns"),
        "openrft.ray_address": lambda r: r["openrft"].update(ray_address="127.0.0.1:6379"),
        "openrft.tools.functions.calc.url": lambda r: r["openrft"].update(
            tools={"functions": {"calc": {"type": "http", "url": internal_url + "/tool"}}}
        ),
        "openrft.tools.functions.calc.sandboxed": lambda r: r["openrft"].update(
            tools={"functions": {"calc": {"type": "python", "function": "os:system", "sandboxed": False}}}
        ),
        "openrft.tools.functions.calc.function": lambda r: r["openrft"].update(
            tools={"functions": {"calc": {"type": "python", "function": "/etc/tool.py:run"}}}
        ),
        "openrft.tools.environment.module": lambda r: r["openrft"].update(tools={"environment": {"module": "os"}}),
    }
    for field, change in cases.items():
        recipe = tiny_recipe(train, validation)
        change(recipe)
        response = alice.post("/v1/nova/jobs", json=recipe)
        assert response.status_code in (400, 403), (field, response.text)
        assert (
            field in [p["param"] for p in response.json()["error"].get("problems", [])]
            or response.json()["error"]["param"] == field
        ), (field, response.text)
    assert _Counting.hits == []  # the service fetched nothing from the internal server


def test_the_outbound_policy():
    assert refusal("https://93.184.216.34/data.jsonl", allow_private=False) is None
    assert refusal("s3://bucket/data.jsonl", allow_private=False) is None
    for url in (
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://10.1.2.3/x",
        "http://192.168.0.1/x",
        "http://169.254.169.254/latest/meta-data",
        "http://100.64.0.1/x",
        "http://0.0.0.0/x",
    ):
        assert "private" in (refusal(url, allow_private=False) or ""), url
        assert refusal(url, allow_private=True) is None, url  # the operator's --allow-private-urls
    assert "file on the server" in (refusal("file:///etc/passwd", allow_private=True) or "")
    assert "scheme" in (refusal("gopher://example.com/", allow_private=True) or "")


@pytest.mark.slow
def test_a_job_trains_with_a_grader_that_finds_no_secret_and_models_stay_with_their_tenant(server, tmp_path):
    alice, bob = server[1]
    train = upload(alice, small_dataset(tmp_path / "train.jsonl", TRAIN, 4))
    validation = upload(alice, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 2))
    job = {
        "model": "openrft-demo",
        "training_file": train,
        "validation_file": validation,
        "method": {
            "type": "reinforcement",
            "reinforcement": {"grader": PROBE, "hyperparameters": {"n_epochs": 1, "batch_size": 4}},
        },
        "openrft": {"max_new_tokens": 4, "eval_max_examples": 2, "eval_at_start": False, "tensorboard": False},
    }
    response = alice.post("/v1/fine_tuning/jobs", json=job)
    assert response.status_code == 200, response.text
    created = response.json()
    done = wait_status(alice, created["id"], ("succeeded", "failed", "cancelled"), timeout=240)
    assert done["status"] == "succeeded", done
    metrics = alice.get(f"/v1/fine_tuning/jobs/{created['id']}/metrics").json()["data"]
    rewards = [m["critic/rewards/mean"] for m in metrics if "critic/rewards/mean" in m]
    assert rewards and all(r == pytest.approx(0.25) for r in rewards), metrics  # 1.0: a secret was read

    # a fine-tuned model (or checkpoint) names its job: only its own tenant may name it
    model = done["fine_tuned_model"]
    assert created["id"] in model
    unknown = model.replace(created["id"], "ftjob-000000000000000000000000")
    theirs_files = {
        "training_file": upload(bob, tmp_path / "train.jsonl"),
        "validation_file": upload(bob, tmp_path / "validation.jsonl"),
    }
    for name in (model, f"ftckpt-{created['id'].removeprefix('ftjob-')}-1"):
        theirs = bob.post("/v1/fine_tuning/jobs", json={**job, **theirs_files, "model": name})
        reference = bob.post("/v1/fine_tuning/jobs", json={**job, **theirs_files, "model": unknown})
        assert theirs.status_code == reference.status_code == 400, theirs.text
        assert theirs.json()["error"]["code"] == reference.json()["error"]["code"] == "model_not_found"
    own = alice.post("/v1/fine_tuning/jobs", json={**job, "model": model})
    assert own.status_code == 400 and own.json()["error"]["code"] == "model_not_supported", own.text


def test_graders_run_on_two_200_kb_texts_answers_400_naming_the_cap_and_the_server_stays_small(server):
    """Issue 24: rouge_l on two 200 KB texts took the server to 4 GB in 22 s and killed it."""
    import psutil

    service, (alice, _), _ = server
    process = psutil.Process(service.processes[0].proc.pid)
    before = process.memory_info().rss
    text = " ".join(f"w{i % 997}" for i in range(40_000))[:200_000]
    for metric in ("rouge_l", "meteor"):
        grader = {
            "type": "text_similarity",
            "name": "sim",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "evaluation_metric": metric,
        }
        response = alice.post(RUN, json={"grader": grader, "model_sample": text, "item": {"reference_answer": text}})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "input_too_large" and error["param"] == "model_sample"
        assert f"{metric} tokens per text" in error["message"], error
    assert process.memory_info().rss - before < 300 << 20
    assert alice.get("/health").status_code == 200


def test_object_store_prefixes_are_whole_path_parts():
    from openrft.calls.outbound import store_refusal
    from openrft.cli.serve import store_prefixes
    from openrft.errors import OpenRFTError

    allowed = ("s3://team-a/shared/", "gs://team-a")
    assert store_refusal("s3://team-a/shared/x.jsonl", allowed) is None
    assert store_refusal("S3://team-a/shared", allowed) is None
    assert store_refusal("gcs://team-a/any/x", allowed) is None  # gcs:// is gs://
    for url in ("s3://team-a/sharedx/y", "s3://team-a/other", "s3://team-a/shared/./../y", "hf://team-a/shared"):
        assert store_refusal(url, allowed) is not None, url
    assert "allowed: none" in store_refusal("s3://b/x", ())
    assert store_prefixes(["alice=s3://b/p", "alice=hf://datasets/o", "*=gs://pub"]) == {
        "alice": ("s3://b/p", "hf://datasets/o"),
        "*": ("gs://pub",),
    }
    for bad in ("s3://b/p", "alice=https://b/p", "alice=s3://", "=s3://b"):
        with pytest.raises(OpenRFTError, match="--allow-store-prefix"):
            store_prefixes([bad])
