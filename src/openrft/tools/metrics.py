"""Metrics of tool-using episodes: turns, calls, errors and latency by tool, episodes ended by an error (by
kind), tokens masked out of the loss; and the job's error budget."""

from __future__ import annotations

from collections import Counter

from openrft.calls.failures import ERROR_KINDS
from openrft.errors import OpenRFTError
from openrft.rollout.types import Completion


class EpisodeErrorBudget(OpenRFTError):
    """More of a batch's episodes ended on an error than ``tools.error_budget`` allows."""


def check_error_budget(completions: list[Completion], budget: float, batch: str) -> None:
    """Raise when more than ``budget`` of the episodes among ``completions`` ended on an error, naming the
    most frequent kind and the first message of that kind (the template, the tool, the server)."""
    failures = [c.metadata["tool_failure"] for c in completions if "tool_failure" in c.metadata]
    episodes = sum("tools" in c.metadata for c in completions)
    if not failures or not episodes or len(failures) <= budget * episodes:
        return
    kind, count = Counter(kind for kind, _ in failures).most_common(1)[0]
    message = next(message for k, message in failures if k == kind)
    raise EpisodeErrorBudget(
        f"{batch}: {len(failures)} of {episodes} episodes ended on an error, more than tools.error_budget "
        f"({budget:g}) allows; the most frequent, {kind} ({count} episodes): {message}"
    )


def tool_metrics(completions: list[Completion], prefix: str = "tools") -> dict[str, float]:
    """Per-step figures over the episodes among ``completions`` (none when no completion is an episode)."""
    stats = [c.metadata["tools"] for c in completions if "tools" in c.metadata]
    if not stats:
        return {}
    n = len(stats)
    turns = [s["turns"] for s in stats]
    calls = [sum(s["calls"].values()) for s in stats]
    masked = [len(c.loss_mask) - sum(c.loss_mask) for c in completions if c.loss_mask is not None]
    metrics = {
        f"{prefix}/turns/mean": sum(turns) / n,
        f"{prefix}/turns/max": float(max(turns)),
        f"{prefix}/calls/mean": sum(calls) / n,
        f"{prefix}/calls/total": float(sum(calls)),
        f"{prefix}/episodes_with_calls": sum(c > 0 for c in calls) / n,
        f"{prefix}/errors/total": float(sum(sum(s["errors"].values()) for s in stats)),
        f"{prefix}/malformed_calls": float(sum(s["malformed"] for s in stats)),
        f"{prefix}/rejected_calls": float(sum(s.get("rejected", 0) for s in stats)),
        f"{prefix}/environment_done": float(sum(bool(s.get("environment_done")) for s in stats)),
        f"{prefix}/environment_close_errors": float(sum(bool(s.get("close_error")) for s in stats)),
        f"{prefix}/failed_episodes": float(sum("tool_failure" in c.metadata for c in completions)),
        **{
            f"{prefix}/episode_errors/{kind}": float(
                sum(c.metadata.get("tool_failure", ("",))[0] == kind for c in completions)
            )
            for kind in ERROR_KINDS
        },
        f"{prefix}/max_turns_ratio": sum(c.finish_reason == "max_turns" for c in completions) / n,
        f"{prefix}/masked_tokens/total": float(sum(masked)),
        f"{prefix}/masked_tokens/mean": sum(masked) / len(masked) if masked else 0.0,
    }
    names = sorted({name for s in stats for name in s["calls"]})
    for name in names:
        count = sum(s["calls"].get(name, 0) for s in stats)
        metrics[f"{prefix}/{name}/calls"] = float(count)
        metrics[f"{prefix}/{name}/errors"] = float(sum(s["errors"].get(name, 0) for s in stats))
        metrics[f"{prefix}/{name}/latency_s/mean"] = sum(s["latency_s"].get(name, 0.0) for s in stats) / count
    return metrics
