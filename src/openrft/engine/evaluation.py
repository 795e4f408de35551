"""Validation: one pass over the held-out prompts with a fixed sampling seed, scored by the job's reward."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from openrft.data.records import Example
from openrft.engine.rollouts import RolloutGroup, score_groups
from openrft.rewards.runner import RewardRunner
from openrft.rewards.stats import reward_metrics
from openrft.rollout.types import Generator, SamplingParams
from openrft.spec.job import EvalSpec
from openrft.tools.metrics import tool_metrics

PASS_SCORE = 1.0


@dataclass
class EvalResult:
    mean_reward: float
    pass_rate: float
    errors: int
    samples: int
    mean_response_length: float
    tools: dict[str, float] = field(default_factory=dict)  # tool episodes' metrics, ``val-score/tools/*``
    rollouts: list[RolloutGroup] = field(default_factory=list, repr=False)  # each prompt's answers, scored

    def metrics(self, k: int, evaluation: EvalSpec | None = None) -> dict[str, float]:
        """The validation metrics; with ``evaluation.pass_k``, ``val-score/pass@k`` for each k up to the
        samples of a prompt (``pass_at_k``)."""
        out = {
            f"val-score/rewards/mean@{k}": self.mean_reward,
            "val-score/pass_rate": self.pass_rate,
            "val-score/errors": float(self.errors),
            "val-score/response_length/mean": self.mean_response_length,
            **self.tools,
        }
        if evaluation is not None and evaluation.pass_k:
            out.update(self.pass_at(evaluation.pass_k, evaluation.success_threshold))
        return out

    def pass_at(self, ks: list[int], threshold: float) -> dict[str, float]:
        """``val-score/pass@k``: the mean over prompts of the unbiased pass@k of each prompt's samples (a sample
        succeeds when it scored at least ``threshold``; a failed score is not a success). A k above the fewest
        samples of a prompt is left out."""
        counts = [
            (len(group.outcomes), sum(o.ok and o.score is not None and o.score >= threshold for o in group.outcomes))
            for group in self.rollouts
            if group.outcomes
        ]
        if not counts:
            return {}
        fewest = min(n for n, _ in counts)
        return {
            f"val-score/pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks if k <= fewest
        }


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` succeeded (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``, the chance that k of the n samples drawn without replacement hold a success."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(
    generator: Generator,
    rewards: RewardRunner,
    examples: list[Example],
    prompt_ids: list[list[int]],
    params: SamplingParams,
    seed: int,
    step: int,
) -> EvalResult:
    """Mean validation reward over every sample that scored; the pass rate counts scores >= 1.

    The same ``seed`` is used at every evaluation, so the baseline and later evaluations differ
    only by the policy, not by sampling luck.
    """
    groups = generator.generate(prompt_ids, params, seed=seed)
    outcomes = score_groups(rewards, examples, groups, step)
    flat = [o for group in outcomes for o in group]
    scores = [o.score for o in flat if o.ok and o.score is not None]
    lengths = [len(c.token_ids) for group in groups for c in group]
    stats = reward_metrics(flat)
    return EvalResult(
        mean_reward=sum(scores) / len(scores) if scores else float("nan"),
        pass_rate=sum(s >= PASS_SCORE for s in scores) / len(flat) if flat else float("nan"),
        errors=int(stats["reward/errors"]),
        samples=len(flat),
        mean_response_length=sum(lengths) / len(lengths) if lengths else 0.0,
        tools=tool_metrics([c for group in groups for c in group], prefix="val-score/tools"),
        rollouts=[RolloutGroup(e, p, g, o) for e, p, g, o in zip(examples, prompt_ids, groups, outcomes)],
    )
