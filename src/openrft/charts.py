"""The charts of a run, by metric name: ``openrft plot`` and the dashboard draw these same series.

``chart_data`` resolves a chart against the rows of a run (metrics.jsonl, or the job store's metric rows):
which metric names it draws (the validation ``mean@k`` the run used, every error kind present) and their
points. ``openrft plot`` draws its result with matplotlib; the dashboard receives it as JSON (``to_json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VALIDATION_PREFIX = "val-score/rewards/mean@"


@dataclass(frozen=True)
class Chart:
    title: str
    metric: str
    band: tuple[str, str] | None = None  # (low, high) metrics drawn as a shaded band
    prefix_match: bool = False  # draw every metric starting with ``metric`` (e.g. error kinds)
    also: tuple[str, ...] = ()  # further metrics drawn as lines on the same axes


CHARTS: tuple[Chart, ...] = (
    Chart("Train reward", "critic/rewards/mean", band=("critic/rewards/min", "critic/rewards/max")),
    Chart("Validation reward", "val-score/rewards/mean@1"),
    Chart("KL to reference", "actor/kl"),
    Chart("Entropy", "actor/entropy"),
    Chart("Clip fraction", "actor/pg_clipfrac"),
    Chart("Response length", "response_length/mean", band=("response_length/min", "response_length/max")),
    Chart("Reward latency (s)", "train_mean_reward_latency"),
    Chart("Reward errors", "reward/errors/", prefix_match=True),
    # the engine-learner mismatch of the rollout correction (rollout.engine server / vllm; docs/algorithm.md)
    Chart("Engine mismatch KL", "rollout_correction/kl"),
    Chart("Engine ratio (mean, spread)", "rollout_correction/ratio_mean", also=("rollout_correction/ratio_std",)),
    Chart(
        "Engine tokens masked / capped",
        "rollout_correction/masked_fraction",
        also=("rollout_correction/truncated_fraction",),
    ),
    Chart("Engine log-probs missing", "rollout_correction/missing_logprobs"),
    # the sync probe after each weight sync, overall and per replica (engine/sync_check.py; docs/monitoring.md)
    Chart("Sync probe max |log-prob diff|", "sync/max_logprob_diff", prefix_match=True),
    # the step's model FLOPs over its time over the machine's matmul peak (engine/step_flops.py)
    Chart(
        "Share of the matmul peak",
        "perf/step_flops_fraction",
        also=("perf/generate_flops_fraction", "perf/learn_flops_fraction"),
    ),
)

REWARD_CHARTS = CHARTS[:2]

# a Tinker training client's rows (service/tinker/records.py): what its forward_backward calls summed to
TINKER_CHARTS: tuple[Chart, ...] = (
    Chart("Loss (sum over tokens and datums)", "loss:sum"),
    Chart("Datums per step", "datums"),
    Chart("Tokens per step", "tokens"),
    Chart("Gradient norm", "grad_norm"),
    Chart("Learning rate", "optim/learning_rate"),
    # where the server's time went between two optim_steps (service/tinker/engine.py take_pending)
    Chart(
        "Server time per step (s)",
        "time/step_s",
        also=("time/sample_s", "time/forward_backward_s", "time/optim_step_s", "time/publish_s"),
    ),
    Chart("Server CPU per step (s)", "time/server_cpu_s", also=("time/sample_cpu_s", "time/forward_backward_cpu_s")),
    # the sync probe when a snapshot's weights are loaded for sampling (engine.py _check_sync)
    Chart("Sync probe max |log-prob diff|", "sync/max_logprob_diff"),
)


@dataclass(frozen=True)
class Series:
    name: str
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class ChartData:
    chart: Chart
    lines: list[Series]
    band: tuple[Series, Series] | None  # (low, high), on the same steps

    @property
    def points(self) -> int:
        return sum(len(line.steps) for line in self.lines)

    def to_json(self) -> dict[str, Any]:
        def one(s: Series) -> dict[str, Any]:
            return {"name": s.name, "steps": s.steps, "values": s.values}

        return {
            "title": self.chart.title,
            "metric": self.chart.metric,
            "points": self.points,
            "lines": [one(s) for s in self.lines],
            "band": {"low": one(self.band[0]), "high": one(self.band[1])} if self.band else None,
        }


def series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the rows of metrics.jsonl that have it."""
    points = [(row["step"], row[metric]) for row in rows if metric in row]
    return [p[0] for p in points], [p[1] for p in points]


def validation_metric(rows: list[dict]) -> str:
    """The validation series present in a run (``mean@k`` for the k the run used)."""
    for row in rows:
        for key in row:
            if key.startswith(VALIDATION_PREFIX):
                return key
    return "val-score/rewards/mean@1"


def chart_data(chart: Chart, rows: list[dict]) -> ChartData:
    """The lines (and min/max band) a chart draws for these rows."""
    metric = validation_metric(rows) if chart.metric.startswith(VALIDATION_PREFIX) else chart.metric
    names = sorted({k for r in rows for k in r if k.startswith(metric)}) if chart.prefix_match else [metric]
    names += list(chart.also)
    lines = [Series(name, *series(rows, name)) for name in names]
    band = None
    if chart.band:
        low, high = chart.band
        both = [r for r in rows if low in r and high in r]
        if both:
            band = (Series(low, *series(both, low)), Series(high, *series(both, high)))
    return ChartData(chart, lines, band)


def charts_data(rows: list[dict], charts: tuple[Chart, ...] = CHARTS) -> list[ChartData]:
    return [chart_data(chart, rows) for chart in charts]


def overlaid(runs: list[tuple[str, list[dict]]], charts: tuple[Chart, ...] = CHARTS) -> list[ChartData]:
    """Several runs' charts on one set of axes: each chart's lines of every run, named ``run: metric`` (the
    run's name alone where a chart has one line per run); no bands, which would hide each other. Of a chart
    of several metrics (the error kinds), the lines that stay at 0 are left out: ten flat lines say nothing."""
    out = []
    for chart in charts:
        lines = []
        for name, rows in runs:
            data = chart_data(chart, rows)
            for line in data.lines:
                if chart.prefix_match and not any(line.values):
                    continue
                label = name if len(data.lines) == 1 else f"{name}: {line.name}"
                lines.append(Series(label, line.steps, line.values))
        out.append(ChartData(chart, lines, None))
    return out
