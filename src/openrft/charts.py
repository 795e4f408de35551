"""The charts of a run, by metric name: ``openrft plot`` and the dashboard draw these same series."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    title: str
    metric: str
    band: tuple[str, str] | None = None  # (low, high) metrics drawn as a shaded band
    prefix_match: bool = False  # draw every metric starting with ``metric`` (e.g. error kinds)


CHARTS: tuple[Chart, ...] = (
    Chart("Train reward", "critic/rewards/mean", band=("critic/rewards/min", "critic/rewards/max")),
    Chart("Validation reward", "val-score/rewards/mean@1"),
    Chart("KL to reference", "actor/kl"),
    Chart("Entropy", "actor/entropy"),
    Chart("Clip fraction", "actor/pg_clipfrac"),
    Chart("Response length", "response_length/mean", band=("response_length/min", "response_length/max")),
    Chart("Reward latency (s)", "train_mean_reward_latency"),
    Chart("Reward errors", "reward/errors/", prefix_match=True),
)

REWARD_CHARTS = CHARTS[:2]


def series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the rows of metrics.jsonl that have it."""
    points = [(row["step"], row[metric]) for row in rows if metric in row]
    return [p[0] for p in points], [p[1] for p in points]


def validation_metric(rows: list[dict]) -> str:
    """The validation series present in a run (``mean@k`` for the k the run used)."""
    for row in rows:
        for key in row:
            if key.startswith("val-score/rewards/mean@"):
                return key
    return "val-score/rewards/mean@1"
