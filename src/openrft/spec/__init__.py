"""The canonical job spec and the dialects that translate user input into it."""

from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.job import (
    AlgorithmSpec,
    CheckpointSpec,
    DataSpec,
    EvalSpec,
    JobSpec,
    LoraSpec,
    ModelSpec,
    OptimizerSpec,
    RolloutSpec,
    RuntimeSpec,
    SamplingSpec,
    TrackingSpec,
    TrainingSpec,
)
from openrft.spec.provenance import Resolution, Source
from openrft.spec.rewards import PresetReward, RewardSpec

__all__ = [
    "AlgorithmSpec",
    "CheckpointSpec",
    "DataSpec",
    "EvalSpec",
    "FieldProblem",
    "JobSpec",
    "LoraSpec",
    "ModelSpec",
    "OptimizerSpec",
    "PresetReward",
    "Resolution",
    "RewardSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "SamplingSpec",
    "Source",
    "SpecError",
    "TrackingSpec",
    "TrainingSpec",
]
