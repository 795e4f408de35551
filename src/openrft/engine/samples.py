"""What the model answered, kept with the job: a few training prompts' samples at every step and every
validation sample at every evaluation, each with its reward, each grader's score and explanation, the
advantage, the policy age and the error kind of a failed reward.

A sample record is one JSON object (``docs/monitoring.md`` lists its fields). In the run directory they are
appended to ``samples.jsonl``; when that file passes a quarter of ``tracking.samples_max_mb`` it is closed as
``samples.N.jsonl`` (N counting up) and the oldest closed files are removed while the total is over the cap.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from openrft.disk_full import append_lines, trim_torn_tail

if TYPE_CHECKING:  # the service reads records without torch
    import torch

    from openrft.engine.rollouts import RolloutGroup

SampleKind = Literal["train", "eval"]
SampleOrder = Literal["step", "-step", "reward", "-reward", "advantage", "-advantage"]
ORDERS: tuple[str, ...] = ("step", "-step", "reward", "-reward", "advantage", "-advantage")
SampleListener = Callable[[str, int, list[dict[str, Any]]], None]
"""Called with (kind, step, records) each time samples are recorded: the service's store, MLflow."""

SAMPLES_FILE = "samples.jsonl"
TEXT_LIMIT = 32_000
"""Characters kept of one text (a prompt message, a response, a tool result); the rest is counted, not kept."""
SEGMENTS_PER_CAP = 4
_SEGMENT = re.compile(r"samples\.(\d+)\.jsonl")


def cut(value: Any) -> Any:
    """``value`` with every string longer than TEXT_LIMIT cut, saying how much was left out."""
    if isinstance(value, str):
        if len(value) <= TEXT_LIMIT:
            return value
        return value[:TEXT_LIMIT] + f"... ({len(value) - TEXT_LIMIT} more characters)"
    if isinstance(value, dict):
        return {k: cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cut(v) for v in value]
    return value


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def graders_of(outcome, reward_name: str) -> dict[str, dict[str, Any]]:
    """Each grader's own score and explanation: a composite's parts (its sub-scores, a Lambda's ``Reward``
    metrics), else the reward itself."""
    names = list(dict.fromkeys([*outcome.sub_scores, *outcome.explanations]))
    if not names and outcome.ok:
        names = [reward_name]
    graders = {}
    for name in names:
        score = outcome.sub_scores.get(name, outcome.score if name == reward_name or len(names) == 1 else None)
        graders[name] = {"score": _number(score), "explanation": outcome.explanations.get(name)}
    return graders


def sample_records(
    kind: SampleKind,
    step: int,
    groups: list[RolloutGroup],
    reward_name: str,
    learner_version: int,
    advantages: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """One record per completion of ``groups``; ``advantages`` ([groups, samples], NaN where a sample was left
    out of the update) for training samples."""
    records = []
    for i, group in enumerate(groups):
        age = learner_version - group.policy_version
        for j, (completion, outcome) in enumerate(zip(group.completions, group.outcomes)):
            advantage = None
            if advantages is not None and j < advantages.shape[1]:
                advantage = _number(float(advantages[i, j]))
            records.append(
                {
                    "id": f"{kind}-{step}-{i}-{j}",
                    "kind": kind,
                    "step": step,
                    "example_id": str(group.example.id),
                    "prompt_index": i,
                    "sample_index": j,
                    "prompt": cut(group.example.messages),
                    "response": cut(completion.text),
                    "turns": cut(completion.turns) if completion.turns is not None else None,
                    "finish_reason": completion.finish_reason,
                    "response_tokens": len(completion.token_ids),
                    "reward": _number(outcome.score) if outcome.ok else None,
                    "error_kind": outcome.error_kind,
                    "error_message": cut(outcome.error_message) if outcome.error_message else None,
                    "warnings": cut(outcome.warnings),
                    "graders": graders_of(outcome, reward_name),
                    "metrics": {k: _number(v) for k, v in outcome.metrics.items()},
                    "advantage": advantage,
                    "policy_version": completion.policy_version,
                    "policy_age": age,
                }
            )
    return records


class SampleLog:
    """``RUN_DIR/samples.jsonl`` and its closed segments, under ``max_bytes`` in total."""

    def __init__(self, run_dir: Path, max_bytes: int):
        self.run_dir = Path(run_dir)
        self.max_bytes = max_bytes
        self.segment_bytes = max(1, max_bytes // SEGMENTS_PER_CAP)
        self.path = self.run_dir / SAMPLES_FILE

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        append_lines(self.path, [json_line(r) for r in records])  # whole, on a full disk too
        if self.path.stat().st_size >= self.segment_bytes:
            self._rotate()

    def _rotate(self) -> None:
        closed = segments(self.run_dir)
        number = int(_SEGMENT.fullmatch(closed[-1].name).group(1)) + 1 if closed else 1  # type: ignore[union-attr]
        self.path.replace(self.run_dir / f"samples.{number}.jsonl")
        closed = segments(self.run_dir)
        total = sum(p.stat().st_size for p in closed)
        while closed and total > self.max_bytes:
            oldest = closed.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink()

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (a resumed run records them again), each file replaced atomically."""
        for path in [*segments(self.run_dir), self.path]:
            if not path.exists():
                continue
            trim_torn_tail(path)  # a line a crash cut short
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
            if len(kept) == len(lines):
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            tmp.replace(path)


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one JSON line: UTF-8 as it is, or with ``\\u`` escapes when it holds a lone surrogate (a
    dataset's JSON may carry ``\\ud800``, which UTF-8 cannot encode: the write raised and failed the job)."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record)
    return line


def segments(run_dir: Path) -> list[Path]:
    """The closed segments of a run's samples, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("samples.*.jsonl") if (m := _SEGMENT.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def read_samples(run_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Every sample record of a run directory, oldest first."""
    run_dir = Path(run_dir)
    for path in [*segments(run_dir), run_dir / SAMPLES_FILE]:
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The prompt as one line of text: its last user message (what a reader recognises a prompt by)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return ""


def flat_row(record: dict[str, Any]) -> dict[str, Any]:
    """A record as one table row of plain values: MLflow's table, TensorBoard's text, the CLI."""
    graders = record.get("graders") or {}
    return {
        "kind": record["kind"],
        "step": record["step"],
        "example_id": record["example_id"],
        "sample_index": record["sample_index"],
        "prompt": prompt_text(record["prompt"]),
        "response": record["response"],
        "reward": record["reward"],
        "advantage": record.get("advantage"),
        "policy_age": record.get("policy_age"),
        "error_kind": record.get("error_kind"),
        "graders": "; ".join(f"{name}={_shown(g.get('score'))}" for name, g in graders.items()),
        "explanations": "; ".join(f"{name}: {g['explanation']}" for name, g in graders.items() if g.get("explanation")),
    }


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


MARKDOWN_CELL = 300


def _cell(value: Any) -> str:
    text = _shown(value)
    if len(text) > MARKDOWN_CELL:
        text = text[:MARKDOWN_CELL] + "…"
    return text.replace("|", "\\|").replace("\n", "<br>")


def samples_markdown(records: list[dict[str, Any]]) -> str:
    """A Markdown table of records (TensorBoard's text tab renders it), texts cut to a few hundred characters."""
    columns = ("example_id", "sample_index", "prompt", "response", "reward", "advantage", "error_kind", "graders")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for record in records:
        row = flat_row(record)
        lines.append("| " + " | ".join(_cell(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def matches(
    record: dict[str, Any],
    kind: str | None = None,
    step: int | None = None,
    example_id: str | None = None,
    error_kind: str | None = None,
    grader: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
) -> bool:
    """Whether a record passes the filters of the samples route (``error_kind`` "any": every failed sample;
    a reward bound leaves out failed samples, which have none)."""
    reward = record.get("reward")
    return (
        (kind is None or record["kind"] == kind)
        and (step is None or record["step"] == step)
        and (example_id is None or record["example_id"] == example_id)
        and (
            error_kind is None
            or (record.get("error_kind") is not None if error_kind == "any" else record.get("error_kind") == error_kind)
        )
        and (grader is None or grader in (record.get("graders") or {}))
        and (min_reward is None or (reward is not None and reward >= min_reward))
        and (max_reward is None or (reward is not None and reward <= max_reward))
    )


def ordered(records: list[dict[str, Any]], order: str) -> list[dict[str, Any]]:
    """Records in the samples route's ``order`` (``step``: as recorded; ``-`` first: descending; samples
    without the value last)."""
    if order == "step":
        return records
    if order == "-step":
        return records[::-1]
    key = order.lstrip("-")
    present = [r for r in records if r.get(key) is not None]
    missing = [r for r in records if r.get(key) is None]
    return sorted(present, key=lambda r: r[key], reverse=order.startswith("-")) + missing
