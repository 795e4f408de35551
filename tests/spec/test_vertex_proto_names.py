"""Vertex request bodies in both JSON spellings: the lowerCamelCase JSON names and the proto field names
(snake_case), which the protobuf JSON mapping has parsers accept and the Python SDK and gcloud write. Both
resolve to the same job; errors and ``spec explain`` name the canonical JSON fields."""

from __future__ import annotations

import json

import pytest

from openrft.cli import main
from openrft.spec.dialects import detect_dialect, resolve_document
from openrft.spec.dialects.vertex import canonical_names
from openrft.spec.errors import SpecError
from tests.published.jobs import DEMO, TRAIN, VALIDATION

CAMEL = {
    "tunedModelDisplayName": "spelling",
    "baseModel": DEMO,
    "labels": {"team_name": "corpus", "mlflow_run_name": "r1"},
    "reinforcementTuningSpec": {
        "trainingDatasetUri": TRAIN,
        "validationDatasetUri": VALIDATION,
        "hyperParameters": {
            "epochCount": 1,
            "learningRateMultiplier": 3,
            "samplesPerPrompt": 4,
            "batchSize": 4,
            "maxOutputTokens": 16,
            "adapterSize": "ADAPTER_SIZE_TWO",
            "evaluateInterval": 2,
            "checkpointInterval": 4,
        },
        "singleRewardConfig": {
            "rewardName": "exact",
            "parseResponseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": "(\\d+)"},
            "stringMatchRewardScorer": {
                "correctAnswerReward": 1,
                "wrongAnswerReward": 0,
                "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.answer}}"},
            },
        },
    },
    "openrft": {"eval_max_examples": 8},
}


def snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def proto_names(value, keep_keys: bool = False):
    if isinstance(value, list):
        return [proto_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    return {
        (k if keep_keys else snake(k)): (v if k in ("labels", "openrft") else proto_names(v)) for k, v in value.items()
    }


PROTO = proto_names(CAMEL)


def test_the_fixture_really_uses_proto_names():
    assert "reinforcement_tuning_spec" in PROTO and "hyper_parameters" in PROTO["reinforcement_tuning_spec"]
    assert PROTO["labels"] == CAMEL["labels"]  # a map's keys are the user's own
    assert canonical_names(PROTO) == CAMEL


def test_both_spellings_resolve_to_the_same_job(tmp_path):
    assert detect_dialect(PROTO) == "vertex"
    camel, proto = resolve_document(CAMEL, base_dir=tmp_path), resolve_document(PROTO, base_dir=tmp_path)
    assert proto.spec == camel.spec
    assert proto.spec.optimizer.lr == pytest.approx(3 * 2e-4) and proto.spec.lora.rank == 2
    assert proto.spec.metadata == {"labels": {"team_name": "corpus", "mlflow_run_name": "r1"}}
    assert {p: s.field for p, s in proto.provenance.items() if p != "dialect"} == {
        p: s.field for p, s in camel.provenance.items() if p != "dialect"
    }


def test_explain_shows_the_canonical_names(tmp_path, capsys):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(PROTO))
    assert main(["spec", "explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "from reinforcementTuningSpec.hyperParameters.learningRateMultiplier" in out
    assert "hyper_parameters" not in out and "written with proto field names" in out


def test_errors_name_the_canonical_field(tmp_path):
    bad = proto_names(CAMEL)
    bad["reinforcement_tuning_spec"]["hyper_parameters"]["learning_rate_multiplier"] = 9
    with pytest.raises(SpecError) as info:
        resolve_document(bad, base_dir=tmp_path)
    assert [p.path for p in info.value.problems] == ["reinforcementTuningSpec.hyperParameters.learningRateMultiplier"]


def test_a_field_in_both_spellings_is_a_problem(tmp_path):
    both = json.loads(json.dumps(CAMEL))
    both["base_model"] = "other"
    with pytest.raises(SpecError, match="baseModel: is also given as base_model: write it once"):
        resolve_document(both, base_dir=tmp_path)


def test_rewards_test_reads_a_reward_config_in_proto_names(tmp_path, capsys):
    config = tmp_path / "reward.json"
    config.write_text(json.dumps(PROTO["reinforcement_tuning_spec"]["single_reward_config"]))
    line = tmp_path / "line.json"
    line.write_text(
        json.dumps({"contents": [{"role": "user", "parts": [{"text": "2+3?"}]}], "references": {"answer": "5"}})
    )
    assert main(["rewards", "test", str(config), "--example", str(line), "--response", "it is 5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 1.0
    config.write_text(json.dumps(PROTO))  # the whole request
    assert main(["rewards", "test", str(config), "--example", str(line), "--response", "it is 4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 0.0
