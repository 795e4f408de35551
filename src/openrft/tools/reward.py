"""The reward of tool-using episodes: an episode a tool could not finish is a failure of that tool's kind
(never a silent 0); an episode whose environment scored it takes that score; the rest go to the job's reward."""

from __future__ import annotations

from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample


class EpisodeReward:
    def __init__(self, inner: RewardFunction):
        self.inner = inner
        self.name = inner.name
        self.requires_reference = inner.requires_reference

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        outcomes: list[RewardOutcome | None] = [None] * len(samples)
        rest: list[int] = []
        for i, sample in enumerate(samples):
            failure = sample.metadata.get("tool_failure")
            environment = sample.metadata.get("environment_reward")
            if failure:
                kind, message = failure
                outcomes[i] = RewardOutcome.failure(kind, f"the episode ended on a tool failure: {message}")
            elif environment is not None:
                outcomes[i] = RewardOutcome(score=float(environment), sub_scores={"environment": float(environment)})
            else:
                rest.append(i)
        if rest:
            for i, outcome in zip(rest, await self.inner.score([samples[i] for i in rest]), strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def aclose(self) -> None:
        await self.inner.aclose()
