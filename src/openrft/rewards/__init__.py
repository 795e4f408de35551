"""Rewards: one async batched protocol and every reward kind behind it."""

from openrft.rewards.registry import build_reward
from openrft.rewards.runner import RewardRunner
from openrft.rewards.stats import reward_metrics
from openrft.rewards.types import ERROR_KINDS, RewardFunction, RewardOutcome, RewardSample

__all__ = [
    "ERROR_KINDS",
    "RewardFunction",
    "RewardOutcome",
    "RewardRunner",
    "RewardSample",
    "build_reward",
    "reward_metrics",
]
