"""RewardSpec -> a RewardFunction."""

from __future__ import annotations

from openrft.errors import RewardError
from openrft.rewards.presets import PRESETS
from openrft.rewards.types import RewardFunction
from openrft.spec.rewards import PresetReward, RewardSpec


def build_reward(spec: RewardSpec) -> RewardFunction:
    config = spec.function
    if isinstance(config, PresetReward):
        return PRESETS[config.name]()
    raise RewardError(f"reward type {config.type!r} is not available in this build")
