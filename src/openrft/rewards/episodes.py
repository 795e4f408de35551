"""The reward of tool-using episodes: an episode a tool could not finish is a failure of that tool's kind
(never a silent 0); an episode whose environment scored it takes that score, a trajectory whose agent sent
UpdateReward its rewards' sum; the rest go to the job's reward.

Per-turn rewards (an environment's ``step`` returning ``Step(reward=...)``) are ignored by default; with
``tools.turn_rewards: sum`` the sample's reward is its return over the episode: the episode's score plus
every turn's reward (sub-scores ``episode`` and ``turns``)."""

from __future__ import annotations

from dataclasses import replace

from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample


class EpisodeReward:
    def __init__(self, inner: RewardFunction, turn_rewards: str = "ignore"):
        self.inner = inner
        self.name = inner.name
        self.requires_reference = inner.requires_reference
        self.turn_rewards = turn_rewards

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        outcomes: list[RewardOutcome | None] = [None] * len(samples)
        rest: list[int] = []
        for i, sample in enumerate(samples):
            failure = sample.metadata.get("tool_failure")
            environment = sample.metadata.get("environment_reward")
            agent = sample.metadata.get("agent_reward")
            if failure:
                kind, message = failure
                outcomes[i] = RewardOutcome.failure(kind, f"the episode ended on a tool failure: {message}")
            elif environment is not None:
                outcomes[i] = RewardOutcome(score=float(environment), sub_scores={"environment": float(environment)})
            elif agent is not None:  # the agent's UpdateReward (docs/agents.md)
                outcomes[i] = RewardOutcome(score=float(agent), sub_scores={"agent": float(agent)})
            else:
                rest.append(i)
        if rest:
            for i, outcome in zip(rest, await self.inner.score([samples[i] for i in rest]), strict=True):
                outcomes[i] = outcome
        if self.turn_rewards == "sum":
            outcomes = [with_turns(o, s) for o, s in zip(outcomes, samples, strict=True)]
        return [o for o in outcomes if o is not None]

    async def aclose(self) -> None:
        await self.inner.aclose()


def with_turns(outcome: RewardOutcome | None, sample: RewardSample) -> RewardOutcome | None:
    """The episode's score plus the rewards of its turns (a failed outcome stays failed)."""
    turns = sample.metadata.get("turn_rewards")
    if outcome is None or not turns or not outcome.ok or outcome.score is None:
        return outcome
    total = float(sum(turns))
    return replace(
        outcome,
        score=outcome.score + total,
        sub_scores={**outcome.sub_scores, "episode": outcome.score, "turns": total},
    )
