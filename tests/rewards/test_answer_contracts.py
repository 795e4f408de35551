"""A reward's answer is read by its documented contract: the required fields are required, and optional
fields that are malformed are dropped with a warning (counted per step under ``reward/warnings``) while
the score is kept. Nova/Bedrock Lambdas: ``id`` and ``aggregate_reward_score`` required, ``metrics_list``
optional. Vertex Cloud Run scorers: ``reward`` required, ``user_requested_aux_info`` an optional string."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openrft.cli import main
from openrft.rewards.nova import match_entries
from openrft.rewards.stats import reward_metrics
from tests.rewards.helpers import FAST_REMOTE, example, require_bwrap, score

# A Lambda in a published style: metrics_list items keyed "metric" instead of "name" (the optional part is
# malformed), the required aggregate_reward_score valid.
METRIC_KEYED_LAMBDA = """
def lambda_handler(event, context):
    out = []
    for sample in event:
        answer = sample["messages"][-1]["content"].strip()
        correct = 1.0 if answer == str(sample["reference_answer"]) else 0.0
        out.append({"id": sample["id"], "aggregate_reward_score": correct,
                    "metrics_list": [{"metric": "accuracy", "value": correct}]})
    return out
"""


def test_metrics_items_without_a_name_are_dropped_and_counted_the_score_kept(tmp_path):
    require_bwrap()
    path = tmp_path / "reward.py"
    path.write_text(METRIC_KEYED_LAMBDA)
    outcomes = score(
        {"type": "nova_lambda", "endpoint": f"{path}:lambda_handler"}, ["5", "6"], example(reference_answer=5)
    )
    assert [(o.error_kind, o.score) for o in outcomes] == [(None, 1.0), (None, 0.0)]
    [warning] = outcomes[0].warnings
    assert warning.endswith("metrics_list item {'metric': 'accuracy', 'value': 1.0} has no name; dropped")
    metrics = reward_metrics(outcomes)
    assert metrics["reward/warnings"] == 2 and metrics["reward/errors"] == 0 and metrics["critic/rewards/mean"] == 0.5


def test_the_warning_is_shown_by_rewards_test(tmp_path, capsys):
    require_bwrap()
    path = tmp_path / "reward.py"
    path.write_text(METRIC_KEYED_LAMBDA)
    line = tmp_path / "line.json"
    line.write_text(json.dumps({"id": "q", "messages": [{"role": "user", "content": "2+3?"}], "reference_answer": 5}))
    assert main(["rewards", "test", f"{path}:lambda_handler", "--example", str(line), "--response", "5"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "score 1"
    assert "warning:" in captured.err and "has no name; dropped" in captured.err


@pytest.mark.parametrize(
    ("metrics_list", "kept"),
    [
        ([{"name": "a", "value": 1.0, "type": "Reward"}, {"name": "b", "value": "high"}], {"a": 1.0}),
        ([{"name": "a", "value": 1.0, "type": "Reward"}, {"name": "b", "value": 1, "type": "Bonus"}], {"a": 1.0}),
        ([{"value": 1.0}, "accuracy", None], {}),
        ({"accuracy": 1.0}, {}),  # not a list
    ],
)
def test_each_malformed_optional_part_is_one_warning(metrics_list, kept):
    sent = [{"id": "s1"}]
    [outcome] = match_entries(sent, [{"id": "s1", "aggregate_reward_score": 0.7, "metrics_list": metrics_list}], "L")
    assert outcome.ok and outcome.score == 0.7 and outcome.sub_scores == kept
    dropped = 1 if not isinstance(metrics_list, list) else len(metrics_list) - len(kept)
    assert len(outcome.warnings) == dropped and all(w.endswith("dropped") for w in outcome.warnings)


def test_the_required_fields_stay_required():
    sent = [{"id": "s1"}, {"id": "s2"}]
    no_score, no_id = match_entries(sent, [{"id": "s1", "metrics_list": []}, {"aggregate_reward_score": 1.0}], "L")
    assert no_score.error_kind == "invalid_output" and "without aggregate_reward_score" in no_score.error_message
    assert no_id.error_kind == "invalid_output" and "has no id, which the Lambda contract requires" in (
        no_id.error_message or ""
    )
    [bad_score] = match_entries(sent[:1], [{"id": "s1", "aggregate_reward_score": "high"}], "L")
    assert bad_score.error_kind == "invalid_output"


@contextmanager
def cloud_run(answer: dict):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def vertex_cloud_run(url: str) -> dict:
    return {"type": "vertex", "single": {"rewardName": "cr", "cloudRunRewardScorer": {"cloudRunUri": url}}}


def test_cloud_run_aux_info_that_is_not_a_string_is_dropped_the_reward_kept():
    with cloud_run({"reward": 0.7, "user_requested_aux_info": {"why": "close"}}) as url:
        [outcome] = score(vertex_cloud_run(url), ["x"], remote=FAST_REMOTE)
    assert outcome.ok and outcome.score == 0.7
    assert outcome.warnings == ["Cloud Run reward cr user_requested_aux_info is dict, not a string; dropped"]
    with cloud_run({"reward": 0.7, "user_requested_aux_info": "close"}) as url:
        [outcome] = score(vertex_cloud_run(url), ["x"], remote=FAST_REMOTE)
    assert outcome.ok and outcome.warnings == []


def test_cloud_run_without_a_reward_fails():
    with cloud_run({"score": 0.7}) as url:
        [outcome] = score(vertex_cloud_run(url), ["x"], remote=FAST_REMOTE)
    assert outcome.error_kind == "invalid_output" and "without reward" in (outcome.error_message or "")
