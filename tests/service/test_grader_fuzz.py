"""``graders/run`` against large and adversarial inputs through a real server process (issue 24): every OpenAI
grader type (string_check with each operation, text_similarity with every metric, python, score_model and
label_model against a judge on 127.0.0.1, multi), the sample and the item's reference built by Hypothesis from
pathological pieces up to hundreds of KB (``tests/rewards/test_grader_fuzz.py``'s). Each answer is bounded: a
200 with a finite reward, a 400 ``input_too_large`` naming the cap, or a 413 naming the body's cap; within a
time bound; the server's resident memory stays within a bound and it answers ``/health`` throughout. Before
the caps one rouge-L call took the server to 4 GB and killed it; a template of ``{{`` and spaces held its
interpreter for 75 s."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from openrft.spec.rewards import SIMILARITY_METRICS
from tests.rewards.helpers import require_bwrap
from tests.rewards.test_grader_fuzz import GRADE_SOURCE, JUDGE_INPUT, REFERENCE, SAMPLE, adversarial_text
from tests.service.svc_helpers import Service

RUN = "/v1/fine_tuning/alpha/graders/run"
TIME_BOUND_S = 30.0  # one request, on a loaded 2-core machine; the unbounded code took 22-75 s on smaller inputs
RSS_BOUND_MB = 700.0  # growth of the server's resident memory over the whole test (rouge-L alone took it to 4 GB)


class _Judge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    reply = "score: 7"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        message = {"role": "assistant", "content": _Judge.reply}
        data = json.dumps({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data.encode())))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def judge_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.fixture(scope="module")
def served(tmp_path_factory, judge_url):
    import psutil

    require_bwrap()
    root = tmp_path_factory.mktemp("grader-fuzz")
    service = Service(root / "data", f"sqlite:///{root / 'openrft.db'}", env={"OPENRFT_JUDGE_BASE_URL": judge_url})
    try:
        service.serve(workers=0)
        key = _create_key(service.database_url)
        with httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            process = psutil.Process(service.processes[0].proc.pid)
            for grader in GRADERS.values():  # every library and the sandbox loaded before the baseline
                c.post(RUN, json={"grader": grader, "model_sample": "a", "item": {"reference_answer": "a"}})
            yield c, process, process.memory_info().rss
    finally:
        service.stop_all()


def _create_key(database_url: str) -> str:
    """A tenant's key, made in this process (what ``openrft keys create`` does; its process can take a minute
    to exit on a loaded machine, past the helper's timeout)."""
    from openrft.service.store import Store

    store = Store.open(database_url)
    try:
        return store.create_key("alice")[1]
    finally:
        store.close()


def _openai(grader: dict) -> dict:
    return {"name": "g", **grader}


GRADERS: dict[str, dict] = {
    **{
        f"string_check {op}": _openai(
            {"type": "string_check", "input": SAMPLE, "reference": REFERENCE, "operation": op}
        )
        for op in ("eq", "ne", "like", "ilike")
    },
    **{
        f"text_similarity {metric}": _openai(
            {"type": "text_similarity", "input": SAMPLE, "reference": REFERENCE, "evaluation_metric": metric}
        )
        for metric in SIMILARITY_METRICS
    },
    "python": _openai({"type": "python", "source": GRADE_SOURCE}),
    "score_model": _openai({"type": "score_model", "model": "judge", "input": JUDGE_INPUT}),
    "label_model": _openai(
        {
            "type": "label_model",
            "model": "judge",
            "input": JUDGE_INPUT,
            "labels": ["PASS", "FAIL"],
            "passing_labels": ["PASS"],
        }
    ),
    "multi": _openai(
        {
            "type": "multi",
            "graders": {
                "a": {"type": "string_check", "input": SAMPLE, "reference": REFERENCE, "operation": "like"},
                "b": {
                    "type": "text_similarity",
                    "input": SAMPLE,
                    "reference": REFERENCE,
                    "evaluation_metric": "rouge_l",
                },
            },
            "calculate_output": "a * 0.5 + b * 0.5",
        }
    ),
    "output_json template": _openai(
        {"type": "string_check", "input": "{{sample.output_json}}", "reference": "x", "operation": "like"}
    ),
}


@pytest.mark.parametrize("name", list(GRADERS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(sample=adversarial_text(), reference=adversarial_text(), reply=adversarial_text())
def test_graders_run_answers_each_grader_within_bounds(name, sample, reference, reply, served):
    client, process, baseline = served
    _Judge.reply = reply
    body = {"grader": GRADERS[name], "model_sample": sample, "item": {"reference_answer": reference}}
    started = time.perf_counter()
    # sent as JSON escapes: a lone surrogate is valid JSON (httpx's UTF-8 encoder would refuse it)
    response = client.post(RUN, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    elapsed = time.perf_counter() - started
    assert elapsed < TIME_BOUND_S, f"{name}: {elapsed:.1f} s for {len(sample):,} / {len(reference):,} characters"
    assert response.status_code in (200, 400, 413), (name, response.status_code, response.text[:300])
    if response.status_code == 200:
        assert math.isfinite(response.json()["reward"])
    else:
        error = response.json()["error"]
        if response.status_code == 400:
            assert error["code"] == "input_too_large" and "cap of" in error["message"], (name, error)
        else:
            assert "bytes" in error["message"], error
    assert client.get("/health").status_code == 200
    assert process.memory_info().rss - baseline < RSS_BOUND_MB * 2**20, name
