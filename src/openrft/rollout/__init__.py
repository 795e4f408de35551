"""Rollouts: the generator protocol and its engines."""

from openrft.rollout.types import Completion, Generator, SamplingParams

__all__ = ["Completion", "Generator", "SamplingParams"]
