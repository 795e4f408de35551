"""Scored rollout groups -> learner samples with group advantages, and the step's rollout metrics."""

from __future__ import annotations

import numpy as np
import torch

from openrft.algo.advantages import group_advantages
from openrft.engine.rollouts import RolloutGroup
from openrft.errors import RewardError
from openrft.learner.batch import TrainSample
from openrft.rewards.stats import reward_metrics
from openrft.spec.job import DataFilterSpec, JobSpec
from openrft.tools.metrics import tool_metrics


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"{prefix}/mean": sum(values) / len(values), f"{prefix}/max": max(values), f"{prefix}/min": min(values)}


def repeated_run(tokens: list[int], max_ngram_size: int) -> int:
    """The longest stretch of consecutive tokens that each repeat the token ``n`` places before them, for any
    ``n`` up to ``max_ngram_size``: a token said 31 times in a row is a stretch of 30 (n = 1), an n-gram
    said 3 times a stretch of 2n."""
    ids = np.asarray(tokens)
    longest = 0
    for n in range(1, min(max_ngram_size, len(ids) - 1) + 1):
        same = np.concatenate(([0], (ids[n:] == ids[:-n]).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(same))
        if edges.size:
            longest = max(longest, int((edges[1::2] - edges[::2]).max()))
    return longest


def degenerate_samples(groups: list[RolloutGroup], valid_rows: list[list[bool]], spec: DataFilterSpec) -> int:
    """Leave degenerate samples (a repeated stretch longer than ``max_repeated_tokens``) out of the update:
    marks them not valid in ``valid_rows``, the most repetitive first, at most ``max_filter_rate`` of the
    step's samples; returns how many were found degenerate (filtered or not)."""
    found = []
    for i, group in enumerate(groups):
        for j, completion in enumerate(group.completions):
            if valid_rows[i][j]:
                run = repeated_run(completion.token_ids, spec.max_ngram_size)
                if run > spec.max_repeated_tokens:
                    found.append((run, i, j))
    most = int(spec.max_filter_rate * sum(len(g.completions) for g in groups))
    for _, i, j in sorted(found, reverse=True)[:most]:
        valid_rows[i][j] = False
    return len(found)


def build_train_batch(
    groups: list[RolloutGroup],
    spec: JobSpec,
    learner_version: int,
) -> tuple[list[TrainSample], dict[str, float], torch.Tensor]:
    """Apply the reward-failure policy, compute advantages per group, and describe the batch. Also returns
    the advantages ``[groups, samples]``, NaN where a sample is left out of the update (recorded samples).

    ``on_error``: ``exclude`` leaves a failed sample out of its group's mean and std and out of
    the loss; ``zero`` scores it 0 (still counted as an error); ``fail`` stops the job.
    """
    policy = spec.reward.on_error
    outcomes = [o for g in groups for o in g.outcomes]
    failed = [o for o in outcomes if not o.ok]
    if failed and policy == "fail":
        first = failed[0]
        raise RewardError(f"{len(failed)} reward call(s) failed; first: {first.error_kind}: {first.error_message}")

    width = max(len(g.completions) for g in groups)
    # Python rows, one tensor each: element writes would cost ops per sample, every step
    valid_rows = [[o.ok or policy == "zero" for o in g.outcomes] + [False] * (width - len(g.outcomes)) for g in groups]
    score_rows = [
        [float(o.score) if o.ok else 0.0 for o in g.outcomes] + [0.0] * (width - len(g.outcomes)) for g in groups
    ]
    filtering = spec.algorithm.data_filter
    if filtering is not None:
        before = sum(map(sum, valid_rows))
        degenerate = degenerate_samples(groups, valid_rows, filtering)
        filtered = before - sum(map(sum, valid_rows))
    rewards, valid = torch.tensor(score_rows), torch.tensor(valid_rows, dtype=torch.bool)
    advantages = group_advantages(rewards, valid, spec.algorithm.scale_advantages_by_std, spec.algorithm.advantage_eps)
    advantage_rows = advantages.tolist()

    correct = spec.rollout.correction_mode != "off"  # fresh samples carry the engine's log-probs
    samples: list[TrainSample] = []
    ages: list[float] = []
    for i, group in enumerate(groups):
        age = learner_version - group.policy_version
        ages.append(float(age))
        for j, completion in enumerate(group.completions):
            if not valid_rows[i][j] or not completion.token_ids:
                continue
            samples.append(
                TrainSample(
                    prompt_ids=completion.prompt_ids or group.prompt_ids,  # an agent's trajectory has its own
                    response_ids=completion.token_ids,
                    advantage=advantage_rows[i][j],
                    behaviour_logp=completion.logprobs if age > 0 else None,
                    loss_mask=completion.loss_mask,
                    engine_logp=completion.logprobs if age == 0 and correct else None,
                    engine_truncated=completion.logprobs_truncated,
                )
            )

    completions = [c for g in groups for c in g.completions]
    metrics = reward_metrics(outcomes)
    metrics["reward/excluded"] = float(sum(not o.ok for o in outcomes)) if policy == "exclude" else 0.0
    if filtering is not None:
        metrics["data_filter/degenerate"] = float(degenerate)
        metrics["data_filter/filtered"] = float(filtered)
    metrics.update(_stats("response_length", [float(len(c.token_ids)) for c in completions]))
    metrics.update(_stats("prompt_length", [float(len(g.prompt_ids)) for g in groups]))
    metrics.update(tool_metrics(completions))
    metrics["response/aborted_ratio"] = sum(c.finish_reason == "length" for c in completions) / len(completions)
    metrics["rollout/policy_age/mean"] = sum(ages) / len(ages)
    metrics["rollout/policy_age/max"] = max(ages)
    zero_var = sum(bool((advantages[i][valid[i]] == 0).all()) for i in range(len(groups)))
    metrics["rollout/zero_advantage_groups"] = zero_var / len(groups)
    return samples, metrics, advantages.masked_fill(~valid, float("nan"))
