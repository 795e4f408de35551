"""Reward configurations as the job spec holds them. The ``rewards`` package builds functions from these."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PresetReward(_Strict):
    """A built-in reward: ``exact_match`` (normalised text equality) or ``numeric_match``."""

    type: Literal["preset"] = "preset"
    name: Literal["exact_match", "numeric_match"]


RewardConfig = Annotated[PresetReward, Field(discriminator="type")]


class RewardSpec(_Strict):
    function: RewardConfig
    on_error: Literal["exclude", "zero", "fail"] = Field(
        "exclude",
        description="a sample whose reward failed: excluded from its group's advantage (default), "
        "scored 0 (counted all the same), or the job fails",
    )
