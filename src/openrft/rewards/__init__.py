"""Rewards: one async batched protocol and every reward kind behind it."""

from openrft.rewards.runner import RewardRunner
from openrft.rewards.stats import reward_metrics
from openrft.rewards.types import ERROR_KINDS, RewardFunction, RewardOutcome, RewardSample, build_reward

__all__ = [
    "ERROR_KINDS",
    "RewardFunction",
    "RewardOutcome",
    "RewardRunner",
    "RewardSample",
    "build_reward",
    "reward_metrics",
]
