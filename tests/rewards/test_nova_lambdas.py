"""Published-style reward Lambdas run unchanged: the event as the services send it (the dataset row at the
top level of each sample, and under ``metadata``), the handler called as ``(event, context)``, as a file in
the sandbox and behind an HTTP endpoint; each scores exactly what the handler returns when called directly."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from openrft.rewards import RewardSample, build_reward
from openrft.rewards.kinds.nova_lambda import nova_entry
from openrft.spec.rewards import RewardSpec
from tests.rewards.helpers import example, require_bwrap

# The reader style of the services' documentation: reference_answer at the top level of each sample.
TOP_LEVEL_READER = """
import json


def lambda_handler(event, context):
    return lambda_grader(event)


def lambda_grader(samples):
    results = []
    for sample in samples:
        answer = sample["messages"][-1]["content"].strip()
        reference = sample["reference_answer"]["solution"]
        correct = 1.0 if answer == reference else 0.0
        formatted = 1.0 if answer.isdigit() else 0.0
        results.append(
            {
                "id": sample["id"],
                "aggregate_reward_score": 0.8 * correct + 0.2 * formatted,
                "metrics_list": [
                    {"name": "correct", "value": correct, "type": "Reward"},
                    {"name": "formatted", "value": formatted, "type": "Metric"},
                ],
            }
        )
    return results
"""

# The other style seen in published Lambdas: the row's fields under metadata, a partial score.
METADATA_READER = """
def lambda_handler(event, context):
    out = []
    for sample in event:
        reference = int(sample["metadata"]["reference_answer"]["solution"])
        text = sample["messages"][-1]["content"]
        try:
            value = int(text)
        except ValueError:
            score = 0.0
        else:
            score = round(1.0 / (1.0 + abs(value - reference)), 6)
        out.append({"id": sample["id"], "aggregate_reward_score": score})
    return out
"""

COMPLETIONS = ["5", " 5 ", "6", "15", "five", ""]


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def samples() -> list[RewardSample]:
    ex = example(id="q-7", reference_answer={"solution": "5"}, task_id="add-1")
    return [RewardSample(ex, text, step=1, sample_index=i) for i, text in enumerate(COMPLETIONS)]


def score(endpoint: str, batch_size: int = 4) -> list:
    reward = build_reward(
        RewardSpec.model_validate({"function": {"type": "nova_lambda", "endpoint": endpoint, "batch_size": batch_size}})
    )

    async def go():
        try:
            return await reward.score(samples())
        finally:
            await reward.aclose()

    return asyncio.run(go())


@contextmanager
def lambda_endpoint(module):
    """An HTTP endpoint on 127.0.0.1 that passes the POSTed event to the handler, as a Function URL would."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps(module.lambda_handler(event, SimpleNamespace(aws_request_id="http"))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_each_sample_carries_the_row_at_the_top_level_and_under_metadata():
    ex = example(id="q-7", reference_answer={"solution": "5"}, task_id="add-1", metadata={"source": "gsm"})
    entry = nova_entry(RewardSample(ex, "5", step=1, sample_index=0))
    assert entry == {
        "id": "q-7",
        "messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
        "reference_answer": {"solution": "5"},
        "task_id": "add-1",
        "metadata": {"reference_answer": {"solution": "5"}, "task_id": "add-1", "source": "gsm"},
    }


@pytest.mark.parametrize("source", [TOP_LEVEL_READER, METADATA_READER], ids=["top_level", "metadata"])
def test_a_published_lambda_scores_what_it_returns_as_a_file_and_over_http(tmp_path, source):
    require_bwrap()
    path = write(tmp_path, "reward", source)
    module = load(path)
    event = [nova_entry(s) for s in samples()]
    direct = module.lambda_handler(event, SimpleNamespace())
    assert {r["aggregate_reward_score"] for r in direct} != {0.0}  # the reader finds the reference
    as_file = score(f"{path}:lambda_handler")
    with lambda_endpoint(module) as url:
        over_http = score(url)
    for outcomes in (as_file, over_http):
        assert [o.error_kind for o in outcomes] == [None] * len(COMPLETIONS)
        assert [o.score for o in outcomes] == [r["aggregate_reward_score"] for r in direct]
        for outcome, result in zip(outcomes, direct):
            metrics = {m["name"]: m["value"] for m in result.get("metrics_list", [])}
            assert {**outcome.sub_scores, **outcome.metrics} == metrics


def test_hand_computed_scores_of_the_top_level_reader(tmp_path):
    require_bwrap()
    outcomes = score(f"{write(tmp_path, 'reward', TOP_LEVEL_READER)}:lambda_handler")
    # "5" and " 5 " are right and digits (0.8 + 0.2); "6", "15" digits only (0.2); "five", "" neither
    assert [o.score for o in outcomes] == [1.0, 1.0, 0.2, 0.2, 0.0, 0.0]


CONTEXT_PROBE = """
def lambda_handler(event, context):
    remaining = context.get_remaining_time_in_millis()
    return [
        {
            "id": sample["id"],
            "aggregate_reward_score": 1.0,
            "metrics_list": [
                {"name": "remaining_ok", "value": float(0 < remaining <= 30000), "type": "Metric"},
                {"name": "request_id_len", "value": float(len(context.aws_request_id)), "type": "Metric"},
                {"name": "named", "value": float(context.function_name == "probe"), "type": "Metric"},
                {"name": "arn_ok", "value": float(context.invoked_function_arn.endswith(":probe")), "type": "Metric"},
                {"name": "memory", "value": float(context.memory_limit_in_mb), "type": "Metric"},
                {"name": "version", "value": float(context.function_version == "$LATEST"), "type": "Metric"},
            ],
        }
        for sample in event
    ]
"""


def test_the_handler_gets_a_lambda_context(tmp_path):
    require_bwrap()
    path = write(tmp_path, "probe", CONTEXT_PROBE)
    spec = RewardSpec.model_validate(
        {"function": {"type": "nova_lambda", "endpoint": f"{path}:lambda_handler"}, "sandbox": {"time_limit_s": 30}}
    )
    reward = build_reward(spec)

    async def go():
        try:
            return await reward.score(samples()[:1])
        finally:
            await reward.aclose()

    (outcome,) = asyncio.run(go())
    assert outcome.metrics == {
        "remaining_ok": 1.0,
        "request_id_len": 36.0,
        "named": 1.0,
        "arn_ok": 1.0,
        "memory": float(spec.sandbox.memory_limit_mb),
        "version": 1.0,
    }


def test_a_handler_that_raises_fails_its_batch_with_the_users_line(tmp_path):
    require_bwrap()
    path = write(tmp_path, "broken", "def lambda_handler(event, context):\n    return event[0]['nope']\n")
    outcomes = score(f"{path}:lambda_handler")
    assert {o.error_kind for o in outcomes} == {"runtime_error"}
    assert "KeyError: 'nope'" in outcomes[0].error_message and "line 2" in outcomes[0].error_message


def test_a_handler_file_is_checked_before_the_job_starts(tmp_path):
    from openrft.spec.errors import SpecError

    path = write(tmp_path, "one_arg", "def lambda_handler(event):\n    return []\n")
    with pytest.raises(SpecError, match="defines lambda_handler\\(\\) with 1 argument\\(s\\); it is called with 2"):
        build_reward(
            RewardSpec.model_validate({"function": {"type": "nova_lambda", "endpoint": f"{path}:lambda_handler"}})
        )


def test_rewards_test_takes_a_published_lambda_file(tmp_path, capsys):
    require_bwrap()
    from openrft.cli import main

    path = write(tmp_path, "reward", TOP_LEVEL_READER)
    line = tmp_path / "line.json"
    line.write_text(
        json.dumps(
            {"id": "q", "messages": [{"role": "user", "content": "2+3?"}], "reference_answer": {"solution": "5"}}
        )
    )
    assert main(["rewards", "test", f"{path}:lambda_handler", "--example", str(line), "--response", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["score"], out["sub_scores"], out["metrics"]) == (0.2, {"correct": 0.0}, {"formatted": 1.0})


def test_metric_types_are_read_in_either_case():
    from openrft.rewards.kinds.nova_lambda import parse_result_entry
    from openrft.rewards.types import RewardFailure

    entry = {
        "id": "1",
        "aggregate_reward_score": 0.5,
        "metrics_list": [{"name": "a", "value": 1, "type": "reward"}, {"name": "b", "value": 2, "type": "METRIC"}],
    }
    outcome = parse_result_entry(entry, "lambda")
    assert (outcome.score, outcome.sub_scores, outcome.metrics) == (0.5, {"a": 1.0}, {"b": 2.0})
    entry["metrics_list"][0]["type"] = "bonus"  # optional and malformed: dropped with a warning, score kept
    outcome = parse_result_entry(entry, "lambda")
    assert (outcome.score, outcome.sub_scores, outcome.metrics) == (0.5, {}, {"b": 2.0})
    assert outcome.warnings == ["lambda metric a has type 'bonus', not Reward or Metric; dropped"]
    del entry["aggregate_reward_score"]  # required
    with pytest.raises(RewardFailure, match="without aggregate_reward_score"):
        parse_result_entry(entry, "lambda")
