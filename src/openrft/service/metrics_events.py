"""A step's engine metrics (Nova names) -> the ``data`` of an OpenAI metrics event (docs/contracts.md §3)."""

from __future__ import annotations

from typing import Any

from openrft.rewards.types import ERROR_KINDS

VALIDATION_PREFIX = "val-score/rewards/mean@"


def _validation_mean(metrics: dict[str, float]) -> float | None:
    for name, value in metrics.items():
        if name.startswith(VALIDATION_PREFIX):
            return value
    return None


def _graders(metrics: dict[str, float]) -> list[dict[str, Any]]:
    """Per-grader means from the sub-scores the reward reported (``reward/<name>/mean``)."""
    graders = []
    for name, value in sorted(metrics.items()):
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "reward" and parts[2] == "mean" and parts[1] not in ("errors", "metric"):
            graders.append({"name": parts[1], "train_reward_mean": value})
    return graders


def event_data(step: int, total_steps: int, metrics: dict[str, float]) -> dict[str, Any]:
    timing = {
        "sampling": metrics.get("timing/sampling", metrics.get("timing/sampling_and_reward")),
        "training": metrics.get("timing/training"),
        "eval": metrics.get("timing/eval"),
        "full_iteration": metrics.get("perf/time_per_step"),
    }
    return {
        "step": step,
        "total_steps": total_steps,
        "scores": {
            "train_reward_mean": metrics.get("critic/rewards/mean"),
            "valid_reward_mean": _validation_mean(metrics),
            "graders": _graders(metrics),
        },
        "errors": {kind: int(metrics.get(f"reward/errors/{kind}", 0)) for kind in ERROR_KINDS},
        "timing": {"step": {k: v for k, v in timing.items() if v is not None}},
        "metrics": metrics,
    }


def event_message(step: int, total_steps: int, metrics: dict[str, float]) -> str:
    details = []
    if "critic/rewards/mean" in metrics:
        details.append(f"train reward {metrics['critic/rewards/mean']:.4f}")
    valid = _validation_mean(metrics)
    if valid is not None:
        details.append(f"validation reward {valid:.4f}")
    return f"Step {step}/{total_steps}" + (": " + ", ".join(details) if details else "")


def checkpoint_metrics(step: int, metrics: dict[str, float] | None) -> dict[str, Any]:
    metrics = metrics or {}
    return {
        "step": step,
        "train_reward_mean": metrics.get("critic/rewards/mean"),
        "valid_reward_mean": _validation_mean(metrics),
    }
