"""Graders' explanations reach the reward outcome: an OpenAI score_model judge's reply (its rationale) in a
multi grader, a Vertex Cloud Run scorer's ``user_requested_aux_info`` and an autorater's replies in a
composite. A scripted server on 127.0.0.1 answers as a judge and as a Cloud Run service."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openrft.engine.samples import graders_of
from tests.rewards.helpers import example, score

RATIONALE = '{"steps": [{"description": "compares 5 with 5", "conclusion": "equal"}], "result": 0.75}'


@pytest.fixture
def scripted():
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/chat/completions":
                answer = {"choices": [{"message": {"role": "assistant", "content": RATIONALE}}]}
            else:  # the Cloud Run scorer: reward 1 when the response holds the reference
                text = body["response"]["parts"][0]["text"]
                hit = body["example"]["references"]["ground_truth_answer"] in text
                answer = {"reward": 1.0 if hit else 0.0, "user_requested_aux_info": f"looked for 5 in {text!r}"}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_multi_graders_judge_explains_its_score(scripted):
    grader = {
        "type": "multi",
        "name": "both",
        "graders": {
            "exact": {
                "type": "string_check",
                "name": "exact",
                "input": "{{sample.output_text}}",
                "reference": "{{item.reference_answer}}",
                "operation": "eq",
            },
            "judge": {
                "type": "score_model",
                "name": "judge",
                "model": "any",
                "range": [0, 1],
                "input": [{"role": "user", "content": "Grade {{sample.output_text}}"}],
            },
        },
        "calculate_output": "0.5 * exact + 0.5 * judge",
    }
    function = {"type": "openai_grader", "grader": grader}
    [outcome] = score(function, ["5"], judge={"base_url": scripted + "/v1"})
    assert outcome.ok and outcome.score == pytest.approx(0.875)
    assert outcome.explanations == {"judge": RATIONALE}
    graders = graders_of(outcome, "both")
    assert graders == {
        "exact": {"score": 1.0, "explanation": None},
        "judge": {"score": 0.75, "explanation": RATIONALE},
    }


def test_vertex_scorers_explanations_are_kept_by_reward_name(scripted):
    composite = {
        "weightedRewardConfigs": [
            {
                "weight": 1,
                "rewardConfig": {"rewardName": "service", "cloudRunRewardScorer": {"cloudRunUri": scripted + "/score"}},
            },
            {
                "weight": 1,
                "rewardConfig": {
                    "rewardName": "rater",
                    "autoraterScorer": {
                        "autoraterConfig": {"autoraterModel": "any", "samplingCount": 2},
                        "autoraterPrompt": "Rate {{response}}",
                    },
                },
            },
        ]
    }
    function = {"type": "vertex", "composite": composite}
    ex = example(references={"ground_truth_answer": "5"})
    [outcome] = score(function, ["it is 5"], ex, judge={"base_url": scripted + "/v1"})
    assert outcome.ok, outcome.error_message
    assert outcome.explanations == {
        "service": "looked for 5 in 'it is 5'",
        "rater": f"{RATIONALE}\n---\n{RATIONALE}",  # both replies the autorater averaged
    }
    graders = graders_of(outcome, "vertex_composite")
    assert graders["service"] == {"score": 1.0, "explanation": "looked for 5 in 'it is 5'"}
    assert graders["rater"]["score"] == 0.75
