"""Remote rewards against real HTTP servers on 127.0.0.1: batching, faults by kind, retries, circuit."""

import json
import threading
import time
import typing
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openrft.data.records import Example
from openrft.errors import RewardError
from tests.rewards.helpers import FAST_REMOTE, example, reward_server, score


def nova(url, batch_size=4, concurrency=2):
    return {"type": "nova_lambda", "endpoint": url, "batch_size": batch_size, "concurrency_limit": concurrency}


def stats(url):
    with urllib.request.urlopen(url + "stats", timeout=5) as response:
        return json.loads(response.read())


def batch_of(ids_and_texts):
    """Score several examples in one call: (id, completion) pairs against reference 5."""
    import asyncio

    from openrft.rewards import RewardSample, build_reward
    from tests.rewards.helpers import spec

    def run(function, **extra):
        reward = build_reward(spec(function, **extra))
        samples = [
            RewardSample(
                Example(
                    id=i, messages=[{"role": "user", "content": "2+3?"}], fields={"reference_answer": {"answer": "5"}}
                ),
                t,
            )
            for i, t in ids_and_texts
        ]

        async def go():
            try:
                return await reward.score(samples)
            finally:
                await reward.aclose()

        return asyncio.run(go())

    return run


def test_nova_batches_scores_sub_scores_and_metrics():
    with reward_server() as url:
        texts = [(f"ok-{i}", t) for i, t in enumerate(["5", "The answer is 5.", "4", "no idea", "-5", "5.0", "15"])]
        outcomes = batch_of(texts)(nova(url, batch_size=3), remote=FAST_REMOTE)
        assert [o.score for o in outcomes] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        assert [o.sub_scores["format"] for o in outcomes] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
        assert outcomes[1].metrics["response_chars"] == len("The answer is 5.")
        assert all(o.latency_s is not None and o.latency_s > 0 for o in outcomes)
        assert stats(url)["requests"] == 3  # ceil(7 / 3) calls


def test_every_failure_is_counted_under_its_kind_and_never_scored():
    faults = [
        "--fault",
        "drop=drop",
        "--fault",
        "slow=slow",
        "--fault",
        "bad=malformed",
        "--fault",
        "err=http500",
        "--fault",
        "half=bad_entry",
        "--slow-seconds",
        "2",
        "--flaky-rate",
        "0.5",
    ]
    ids = [
        ("ok-1", "5"),
        ("drop-1", "5"),
        ("slow-1", "5"),
        ("bad-1", "5"),
        ("err-1", "5"),
        ("half-1", "5"),
        ("ok-2", "4"),
    ] + [(f"flaky-{i}", "5") for i in range(8)]
    with reward_server(*faults) as url:
        t0 = time.monotonic()
        outcomes = batch_of(ids)(nova(url, batch_size=1, concurrency=8), remote=FAST_REMOTE)
        elapsed = time.monotonic() - t0
        server = stats(url)
    by_id = {i: o for (i, _), o in zip(ids, outcomes)}
    assert by_id["ok-1"].score == 1.0 and by_id["ok-2"].score == 0.0
    assert by_id["drop-1"].error_kind == "server_error"
    assert by_id["slow-1"].error_kind == "timeout"
    assert by_id["bad-1"].error_kind == "invalid_output" and "not JSON" in by_id["bad-1"].error_message
    assert by_id["err-1"].error_kind == "server_error" and "HTTP 500" in by_id["err-1"].error_message
    assert by_id["half-1"].error_kind == "invalid_output" and "aggregate_reward_score" in by_id["half-1"].error_message
    failed = [o for o in outcomes if not o.ok]
    assert len(failed) == 5 and all(o.score is None for o in failed)
    # flaky first attempts were retried and scored
    assert all(by_id[f"flaky-{i}"].score == 1.0 for i in range(8))
    assert server["flaky_drops"] >= 1
    assert server["fault_drop"] == 2 and server["fault_slow"] == 2  # one retry each (FAST_REMOTE)
    assert server["fault_malformed"] == 1  # a malformed body is not retried
    assert elapsed < 10


def test_bad_entry_fails_only_its_sample_in_a_batch():
    with reward_server("--fault", "half=bad_entry") as url:
        outcomes = batch_of([("ok-1", "5"), ("half-1", "5"), ("ok-2", "5")])(
            nova(url, batch_size=8), remote=FAST_REMOTE
        )
    assert [o.score if o.ok else o.error_kind for o in outcomes] == [1.0, "invalid_output", 1.0]


def test_duplicate_ids_are_matched_by_position():
    with reward_server() as url:
        outcomes = batch_of([("same", "5"), ("same", "4"), ("same", "5")])(nova(url, batch_size=8), remote=FAST_REMOTE)
    assert [o.score for o in outcomes] == [1.0, 0.0, 1.0]


def test_an_endpoint_that_is_down_fails_the_job_with_a_clear_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once this block ends: connections are refused
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=rf"reward endpoint Nova reward endpoint {url} is down: 3 calls in a row"):
        batch_of([(f"e{i}", "5") for i in range(10)])(
            nova(url, batch_size=1, concurrency=1), remote={**FAST_REMOTE, "circuit_failures": 3}
        )
    assert time.monotonic() - t0 < 5


class CloudRun(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: typing.ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        CloudRun.seen.append(body)
        text = body["response"]["parts"][0]["text"]
        truth = body["example"]["references"]["ground_truth_answer"]
        answer = {"reward": 2.0 if text == truth else -0.5, "user_requested_aux_info": "checked"}
        if text == "junk":
            answer = {"score": 1}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_cloud_run_reward_one_call_per_sample():
    server = ThreadingHTTPServer(("127.0.0.1", 0), CloudRun)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/score"
        config = {
            "type": "vertex",
            "single": {
                "parseResponseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": r"answer: (\w+)"},
                "cloudRunRewardScorer": {"cloudRunUri": url},
            },
        }
        CloudRun.seen.clear()
        outcomes = score(
            config,
            ["answer: 391", "answer: 7", "answer: junk"],
            example(references={"ground_truth_answer": "391"}),
            remote=FAST_REMOTE,
        )
    finally:
        server.shutdown()
    assert [o.score if o.ok else o.error_kind for o in outcomes] == [1.0, -0.5, "invalid_output"]  # 2.0 clipped
    assert len(CloudRun.seen) == 3
    assert CloudRun.seen[0]["metadata"] == {"step": 1, "tuning_job_id": 0}
    assert CloudRun.seen[0]["example"]["contents"][0] == {"role": "user", "parts": [{"text": "What is 2+3?"}]}


CALLABLE_MODULE = """
def score(batch):
    out = []
    for entry in batch:
        reference = entry["metadata"]["reference_answer"]
        if entry["completion"] == "boom":
            out.append("not a number")
        elif entry["completion"] == "nova":
            out.append({"id": entry["id"], "aggregate_reward_score": 0.5,
                        "metrics_list": [{"name": "style", "value": 0.25, "type": "Reward"}]})
        else:
            out.append({"score": float(entry["completion"] == reference), "metrics": {"len": len(entry["completion"])}})
    return out

def crash(batch):
    raise RuntimeError("reward code crashed")
"""


@pytest.mark.parametrize("sandboxed", [False, True])
def test_python_callable_rewards(tmp_path, monkeypatch, sandboxed):
    if sandboxed:
        from tests.rewards.helpers import require_bwrap

        require_bwrap()
    (tmp_path / "my_rewards.py").write_text(CALLABLE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    outcomes = score(
        {"type": "callable", "target": "my_rewards:score", "sandboxed": sandboxed}, ["5", "4", "boom", "nova"]
    )
    assert [o.score if o.ok else o.error_kind for o in outcomes] == [1.0, 0.0, "invalid_output", 0.5]
    assert outcomes[0].metrics["len"] == 1.0
    assert outcomes[3].sub_scores == {"style": 0.25}
    crashed = score({"type": "callable", "target": "my_rewards:crash", "sandboxed": sandboxed}, ["5", "4"])
    assert [o.error_kind for o in crashed] == ["runtime_error", "runtime_error"]
    assert "reward code crashed" in crashed[0].error_message


def test_callable_that_cannot_be_imported_is_a_config_error():
    from openrft.spec.errors import SpecError

    with pytest.raises(SpecError, match=r"reward\.function\.target: reward callable nowhere_mod:f: cannot import"):
        score({"type": "callable", "target": "nowhere_mod:f"}, ["x"])
