"""Where the learner's batches come from: prompts sampled, completions generated and scored.

A rollout group is the ``n`` completions of one prompt with their reward outcomes. The synchronous
source generates with the current policy at every step; asynchronous sources (``runtime``) produce
groups ahead of the learner and tag them with the policy version that made them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from openrft.data.records import Example
from openrft.data.sampler import EpochSampler
from openrft.rewards.runner import RewardRunner
from openrft.rewards.types import RewardOutcome, RewardSample
from openrft.rollout.types import Completion, Generator, SamplingParams


@dataclass
class RolloutGroup:
    example: Example
    prompt_ids: list[int]
    completions: list[Completion]
    outcomes: list[RewardOutcome]

    @property
    def policy_version(self) -> int:
        return min(c.policy_version for c in self.completions)


def reward_samples(examples: list[Example], groups: list[list[Completion]], step: int) -> list[RewardSample]:
    """Every completion of every group, flattened in group order, as reward samples."""
    return [
        RewardSample(example=example, completion=c.text, step=step, sample_index=j, turns=c.turns, metadata=c.metadata)
        for example, group in zip(examples, groups)
        for j, c in enumerate(group)
    ]


def split_outcomes(groups: list[list[Completion]], flat: list[RewardOutcome]) -> list[list[RewardOutcome]]:
    """The flat outcomes of ``reward_samples`` regrouped per prompt."""
    out, start = [], 0
    for group in groups:
        out.append(flat[start : start + len(group)])
        start += len(group)
    return out


def score_groups(
    rewards: RewardRunner, examples: list[Example], groups: list[list[Completion]], step: int
) -> list[list[RewardOutcome]]:
    """Score every completion of every group in one batched call."""
    return split_outcomes(groups, rewards.score(reward_samples(examples, groups, step)))


class SyncRolloutSource:
    """Generates each step's groups with the current policy: every rollout has policy age 0."""

    def __init__(
        self,
        generator: Generator,
        rewards: RewardRunner,
        sampler: EpochSampler,
        examples: list[Example],
        prompt_ids: list[list[int]],
        params: SamplingParams,
    ):
        self.generator, self.rewards, self.sampler = generator, rewards, sampler
        self.examples, self.prompt_ids, self.params = examples, prompt_ids, params
        self.generate_seconds: float | None = None  # the last batch's sampling alone (rewards left out)

    def next_batch(self, step: int) -> list[RolloutGroup]:
        indices = self.sampler.next_batch()
        examples = [self.examples[i] for i in indices]
        prompts = [self.prompt_ids[i] for i in indices]
        start = time.perf_counter()
        groups = self.generator.generate(prompts, self.params)
        self.generate_seconds = time.perf_counter() - start
        outcomes = score_groups(self.rewards, examples, groups, step)
        return [RolloutGroup(e, p, g, o) for e, p, g, o in zip(examples, prompts, groups, outcomes)]

    def policy_updated(self, version: int) -> None:
        """The generator shares the learner's model: nothing to send."""

    def step_metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        return None
