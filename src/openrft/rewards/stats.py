"""Per-step reward metrics: mean/min/max, sub-score means, error counts per kind, latency mean and p95.

Failed samples never enter the mean/min/max (they have no score); they are counted under
``reward/errors/<kind>``; malformed optional parts of an answer that were dropped (the sample still
scored) are counted under ``reward/warnings``. Sub-scores (composite parts, multi grader keys, Nova ``Reward`` metrics)
are averaged as ``reward/<name>/mean``, metrics as ``reward/metric/<name>/mean``; latency is the
Vertex ``train_mean_reward_latency`` / ``train_p95_reward_latency`` (seconds per sample).
"""

from __future__ import annotations

import math
from collections import defaultdict

from openrft.rewards.types import ERROR_KINDS, RewardOutcome


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def reward_metrics(outcomes: list[RewardOutcome], prefix: str = "critic/rewards") -> dict[str, float]:
    scores = [o.score for o in outcomes if o.ok and o.score is not None]
    metrics: dict[str, float] = {}
    if scores:
        metrics[f"{prefix}/mean"] = sum(scores) / len(scores)
        metrics[f"{prefix}/max"] = max(scores)
        metrics[f"{prefix}/min"] = min(scores)
    failed = [o for o in outcomes if not o.ok]
    metrics["reward/samples"] = float(len(outcomes))
    metrics["reward/scored"] = float(len(scores))
    metrics["reward/errors"] = float(len(failed))
    metrics["reward/warnings"] = float(sum(len(o.warnings) for o in outcomes))
    for kind in ERROR_KINDS:
        metrics[f"reward/errors/{kind}"] = float(sum(o.error_kind == kind for o in failed))
    sub_scores: dict[str, list[float]] = defaultdict(list)
    for outcome in outcomes:
        for name, value in outcome.sub_scores.items():
            sub_scores[name].append(value)
        for name, value in outcome.metrics.items():
            sub_scores[f"metric/{name}"].append(value)
    for name, values in sub_scores.items():
        metrics[f"reward/{name}/mean"] = sum(values) / len(values)
    latencies = [o.latency_s for o in outcomes if o.latency_s is not None]
    if latencies:
        metrics["train_mean_reward_latency"] = sum(latencies) / len(latencies)
        metrics["train_p95_reward_latency"] = percentile(latencies, 95)
    return metrics
