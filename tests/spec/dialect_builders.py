"""Builders of job documents in each dialect, and datasets of a chosen size (imported by the tests)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "arithmetic"
VERTEX_REWARD = {
    "rewardName": "correct",
    "stringMatchRewardScorer": {
        "correctAnswerReward": 1,
        "wrongAnswerReward": 0,
        "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.ground_truth_answer}}"},
    },
}
OPENAI_GRADER = {
    "type": "string_check",
    "name": "eq",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}


def write_dataset(path: Path, count: int) -> Path:
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "reference_answer": str(i)}) + "\n")
    return path


class Sizes:
    """A DatasetSizer answering fixed counts by file name, so that tests need no large files."""

    def __init__(self, train: int, validation: int = 10):
        self.counts = {"train.jsonl": train, "val.jsonl": validation}

    def __call__(self, location: str) -> int:
        return self.counts[Path(location).name]


def vertex_request(hp: dict[str, Any] | None = None, validation: bool = True, **top: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "trainingDatasetUri": "train.jsonl",
        "hyperParameters": hp or {},
        "singleRewardConfig": copy.deepcopy(VERTEX_REWARD),
    }
    if validation:
        spec["validationDatasetUri"] = "val.jsonl"
    return {"baseModel": "openrft-demo", "reinforcementTuningSpec": spec, **top}


def openai_job(hp: dict[str, Any] | None = None, validation: bool = True, **top: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "model": "openrft-demo",
        "training_file": "train.jsonl",
        "method": {
            "type": "reinforcement",
            "reinforcement": {"grader": copy.deepcopy(OPENAI_GRADER), "hyperparameters": hp or {}},
        },
    }
    if validation:
        job["validation_file"] = "val.jsonl"
    return {**job, **top}


def nova_recipe(
    training_config: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    tc = {
        "global_batch_size": 32,
        "rollout": {"rewards": {"preset_reward_function": "exact_match"}},
        "trainer": {"max_steps": 10, "peft": {"peft_scheme": "lora"}, **(trainer or {})},
    }
    for key, value in (training_config or {}).items():
        tc[key] = value
    return {
        "run": {
            "model_name_or_path": "openrft-demo",
            "data_s3_path": "train.jsonl",
            "validation_data_s3_path": "val.jsonl",
            **(run or {}),
        },
        "training_config": tc,
        **top,
    }
