"""Reward configurations as the job spec holds them. The ``rewards`` package builds functions from these.

Each kind keeps the configuration shape of the service it comes from (CONTRACTS.md), under a
``type`` tag of OpenRFT's. The dialects wrap user input in these models; ``rewards.factory`` turns
them into reward functions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PresetReward(_Strict):
    """A built-in reward: ``exact_match`` (normalised text equality) or ``numeric_match``."""

    type: Literal["preset"] = "preset"
    name: Literal["exact_match", "numeric_match"]


class VertexReward(_Strict):
    """A Vertex ``singleRewardConfig`` or ``compositeRewardConfig``, in Vertex's own JSON shape."""

    type: Literal["vertex"] = "vertex"
    single: dict[str, Any] | None = None
    composite: dict[str, Any] | None = None


class OpenAIGraderReward(_Strict):
    """An OpenAI grader object (string_check, text_similarity, python, score_model, label_model, multi)."""

    type: Literal["openai_grader"] = "openai_grader"
    grader: dict[str, Any]


class NovaLambdaReward(_Strict):
    """The Nova reward "Lambda" batch contract, called over HTTP at ``endpoint``."""

    type: Literal["nova_lambda"] = "nova_lambda"
    endpoint: str
    batch_size: int = Field(128, ge=1)
    concurrency_limit: int = Field(12, ge=1)


class CallableReward(_Strict):
    """A Python function named ``module:function`` taking a batch of samples."""

    type: Literal["callable"] = "callable"
    target: str
    sandboxed: bool = False


RewardConfig = Annotated[
    PresetReward | VertexReward | OpenAIGraderReward | NovaLambdaReward | CallableReward,
    Field(discriminator="type"),
]


class RewardSpec(_Strict):
    function: RewardConfig
    on_error: Literal["exclude", "zero", "fail"] = Field(
        "exclude",
        description="a sample whose reward failed: excluded from its group's advantage (default), "
        "scored 0 (counted all the same), or the job fails",
    )
