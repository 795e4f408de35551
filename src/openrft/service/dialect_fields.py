"""Where each job dialect names its datasets, model and reward (shared by the server and the SDK)."""

from __future__ import annotations

from typing import Any

FieldPath = tuple[str, ...]

# (training data, validation data) per dialect
DATA_FIELDS: dict[str, tuple[FieldPath, FieldPath]] = {
    "openai": (("training_file",), ("validation_file",)),
    "vertex": (("reinforcementTuningSpec", "trainingDatasetUri"), ("reinforcementTuningSpec", "validationDatasetUri")),
    "nova": (("run", "data_s3_path"), ("run", "validation_data_s3_path")),
}
MODEL_FIELD = {"openai": "model", "vertex": "baseModel", "nova": "run.model_name_or_path"}
REWARD_FIELD = {
    "openai": "method.reinforcement.grader",
    "vertex": "reinforcementTuningSpec",
    "nova": "training_config.rollout.rewards",
}


def get_field(document: Any, path: FieldPath) -> Any:
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def set_field(document: dict, path: FieldPath, value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value
