"""``openrft rewards test|validate``, per-step reward metrics, and spec shapes with user paths."""

import json

import pytest
from pydantic import ValidationError

from openrft.cli import main
from openrft.rewards.stats import reward_metrics
from openrft.rewards.types import RewardOutcome
from openrft.spec.errors import problems_from_validation
from openrft.spec.rewards import NovaLambdaReward, OpenAIGraderReward, RewardSpec, VertexReward

GRADER = {
    "type": "multi",
    "name": "m",
    "calculate_output": "0.5 * exact + 0.5 * near",
    "graders": {
        "exact": {
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "operation": "eq",
        },
        "near": {
            "type": "string_check",
            "name": "near",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "operation": "like",
        },
    },
}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "grader.json").write_text(json.dumps(GRADER))
    (tmp_path / "example.json").write_text(
        json.dumps({"id": "1", "messages": [{"role": "user", "content": "2+3?"}], "reference_answer": "5"})
    )
    (tmp_path / "vertex.json").write_text(
        json.dumps(
            {
                "reinforcementTuningSpec": {
                    "singleRewardConfig": {
                        "rewardName": "r",
                        "stringMatchRewardScorer": {
                            "stringMatchExpression": {
                                "matchOperation": "EXACT_MATCH",
                                "expression": "{{references.gt}}",
                            }
                        },
                    }
                }
            }
        )
    )
    (tmp_path / "vertex_example.json").write_text(
        json.dumps({"contents": [{"role": "user", "parts": [{"text": "17*23?"}]}], "references": {"gt": "391"}})
    )
    return tmp_path


def test_rewards_test_json(files, capsys):
    assert (
        main(
            [
                "rewards",
                "test",
                str(files / "grader.json"),
                "--example",
                str(files / "example.json"),
                "--response",
                "it is 5",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["score"] == 0.5 and out["sub_scores"] == {"exact": 0.0, "near": 1.0} and out["error_kind"] is None
    assert out["openai"]["reward"] == 0.5 and out["openai"]["sub_rewards"] == {"exact": 0.0, "near": 1.0}


def test_rewards_test_vertex_request_and_example(files, capsys):
    assert (
        main(
            [
                "rewards",
                "test",
                str(files / "vertex.json"),
                "--example",
                str(files / "vertex_example.json"),
                "--response",
                " 391 ",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["vertex"] == {
        "overallReward": 1.0,
        "error": None,
        "rewardInfoDetails": {"r": {"reward": 1.0, "userRequestedAuxInfo": ""}},
    }


def test_rewards_test_reports_an_error_kind(files, capsys):
    (files / "json_grader.json").write_text(
        json.dumps(
            {
                "type": "string_check",
                "name": "s",
                "input": "{{sample.output_json.a}}",
                "reference": "1",
                "operation": "eq",
            }
        )
    )
    assert (
        main(
            [
                "rewards",
                "test",
                str(files / "json_grader.json"),
                "--example",
                str(files / "example.json"),
                "--response",
                "not json",
            ]
        )
        == 1
    )
    assert capsys.readouterr().out.startswith("error parse_error: the output is not valid JSON")


def test_rewards_validate(files, capsys):
    assert main(["rewards", "validate", str(files / "grader.json")]) == 0
    assert "valid" in capsys.readouterr().out
    bad = dict(GRADER, calculate_output="exact + far")
    (files / "bad.json").write_text(json.dumps({"method": {"type": "reinforcement", "reinforcement": {"grader": bad}}}))
    assert main(["rewards", "validate", str(files / "bad.json"), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False
    assert out["problems"] == [
        "reward.function.grader.calculate_output: 'exact + far' names far that are not graders; known: exact, near"
    ]
    shape = dict(GRADER, graders={"exact": dict(GRADER["graders"]["exact"], operation="equals")})
    (files / "shape.json").write_text(json.dumps({"method": {"reinforcement": {"grader": shape}}}))
    assert main(["rewards", "validate", str(files / "shape.json")]) == 2
    assert "method.reinforcement.grader.graders.exact.operation: 'equals' is not one of" in capsys.readouterr().out


def test_reward_metrics():
    outcomes = [
        RewardOutcome(score=1.0, sub_scores={"a": 1.0}, metrics={"len": 4.0}, latency_s=0.1),
        RewardOutcome(score=-0.5, sub_scores={"a": 0.0}, latency_s=0.3),
        RewardOutcome.failure("timeout", "slow", latency_s=2.0),
        RewardOutcome.failure("parse_error", "bad"),
        RewardOutcome.failure("parse_error", "bad", sub_scores={"a": 0.5}),
    ]
    metrics = reward_metrics(outcomes)
    assert metrics["critic/rewards/mean"] == 0.25
    assert (metrics["critic/rewards/min"], metrics["critic/rewards/max"]) == (-0.5, 1.0)
    assert metrics["reward/samples"] == 5 and metrics["reward/scored"] == 2 and metrics["reward/errors"] == 3
    assert metrics["reward/errors/parse_error"] == 2 and metrics["reward/errors/timeout"] == 1
    assert metrics["reward/errors/server_error"] == 0
    assert metrics["reward/a/mean"] == 0.5 and metrics["reward/metric/len/mean"] == 4.0
    assert metrics["train_mean_reward_latency"] == pytest.approx(0.8)
    assert metrics["train_p95_reward_latency"] == 2.0


def test_dialect_style_construction_and_paths():
    reward = VertexReward(
        composite={
            "weightedRewardConfigs": [
                {
                    "weight": 2,
                    "rewardConfig": {"rewardName": "a", "codeExecutionRewardScorer": {"pythonCodeSnippet": "x"}},
                }
            ]
        }
    )
    assert reward.composite.weightedRewardConfigs[0].weight == 2
    with pytest.raises(ValidationError) as info:
        VertexReward(
            single={
                "rewardName": "a",
                "parseResponseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": "(unclosed"},
                "stringMatchRewardScorer": {
                    "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "x"}
                },
            }
        )
    [problem] = problems_from_validation(info.value, VertexReward)
    assert problem.path == "single.parseResponseConfig.regexExtractExpression"
    assert "is not a valid regular expression" in problem.message
    with pytest.raises(ValidationError, match="needs exactly one of stringMatchRewardScorer"):
        VertexReward(single={"rewardName": "a"})
    with pytest.raises(ValidationError) as info:
        OpenAIGraderReward(
            grader={
                "type": "label_model",
                "name": "l",
                "model": "m",
                "labels": ["a"],
                "passing_labels": ["b"],
                "input": [{"role": "user", "content": "x"}],
            }
        )
    assert "passing_labels ['b'] are not among labels ['a']" in str(info.value)
    assert NovaLambdaReward(endpoint="arn:aws:lambda:us-east-1:1:function:f").transport == "aws"
    assert NovaLambdaReward(endpoint="/abs/reward.py:lambda_handler").transport == "handler"
    with pytest.raises(ValidationError, match="is not an http"):
        NovaLambdaReward(endpoint="reward.py:lambda_handler")  # the dialects make handler paths absolute
    with pytest.raises(ValidationError, match="is not an http"):
        NovaLambdaReward(endpoint="127.0.0.1:8080")
    with pytest.raises(ValidationError) as info:
        RewardSpec.model_validate(
            {
                "function": {
                    "type": "openai_grader",
                    "grader": {
                        "type": "multi",
                        "name": "m",
                        "calculate_output": "k",
                        "graders": {"k": {"type": "python", "name": "k", "source": ""}},
                    },
                }
            }
        )
    [problem] = problems_from_validation(info.value, RewardSpec)
    assert problem.path == "function.grader.graders.k.source"
