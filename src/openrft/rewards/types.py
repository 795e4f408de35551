"""The reward protocol: a batch of samples in, one outcome per sample out (async).

A failed sample has an error kind, the same for every reward kind: those of any call to the outside
(``openrft.calls.failures``: ``parse_error``, ``timeout``, ``runtime_error``, ``server_error``,
``invalid_output``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from openrft.calls.failures import ERROR_KINDS as ERROR_KINDS  # re-exported: the kinds a reward fails with
from openrft.calls.failures import CallFailure, ErrorKind
from openrft.data.records import Example
from openrft.rollout.tool_calls import parse_tool_calls, tool_names

RewardFailure = CallFailure
"""Raised inside reward code for one sample; ``RewardOutcome.of_failure`` makes it a failed outcome of its kind."""


@dataclass
class RewardSample:
    """What a reward sees of one completion: the whole dataset example and the model's text.

    ``turns``: the messages a multi-turn rollout added after the prompt (assistant messages with their
    ``tool_calls``, tool results), ``completion`` then being the final answer. A single-turn sample's one
    assistant message is built from ``completion``, its tool calls parsed when the row offers ``tools``.
    """

    example: Example
    completion: str
    step: int = 0
    sample_index: int = 0
    turns: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # the rollout's (tool failures, environment reward)

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        return self.example.messages

    @cached_property
    def output_messages(self) -> list[dict[str, Any]]:
        """The messages the model's rollout added to the conversation (OpenAI's chat shape)."""
        if self.turns is not None:
            return self.turns
        if not self.example.tools:
            return [{"role": "assistant", "content": self.completion}]
        parsed = parse_tool_calls(self.completion, tool_names(self.example.tools))
        if not parsed.calls:
            return [{"role": "assistant", "content": self.completion}]
        return [{"role": "assistant", "content": parsed.content, "tool_calls": parsed.calls}]

    @property
    def output_tools(self) -> list[dict[str, Any]]:
        """Every tool call of the rollout, in order: OpenAI's ``sample.output_tools``."""
        return [c for m in self.output_messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]

    @property
    def output_text(self) -> str:
        """The last assistant message's content (without its tool-call markup): ``sample.output_text``."""
        for message in reversed(self.output_messages):
            if message["role"] == "assistant":
                return message.get("content") or ""
        return self.completion


@dataclass
class RewardOutcome:
    """A score with optional named sub-scores and metrics, or an error of a named kind (never both)."""

    score: float | None
    sub_scores: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    latency_s: float | None = None
    stdout: str = ""
    """What user reward code printed while scoring this sample (kept apart from OpenRFT's own output)."""
    warnings: list[str] = field(default_factory=list)
    """Malformed optional parts of the reward's answer that were dropped (the score kept); counted per step."""
    explanations: dict[str, str] = field(default_factory=dict)
    """What a grader said of its score, by grader name: an LLM judge's reply (its rationale), a Cloud Run
    scorer's ``user_requested_aux_info``. Recorded with the job's samples; never read by training."""
    limit: str | None = None
    """The input cap a failure hit (``rewards/input_limits.py``): ``graders/run`` answers 400 naming it."""

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @classmethod
    def failure(cls, kind: ErrorKind, message: str, **extra: Any) -> RewardOutcome:
        return cls(score=None, error_kind=kind, error_message=message, **extra)

    @classmethod
    def of_failure(cls, failure: CallFailure, **extra: Any) -> RewardOutcome:
        """The failed outcome of a call that raised ``failure`` (with what its user code printed)."""
        if failure.stdout:
            extra.setdefault("stdout", failure.stdout)
        if failure.limit:
            extra.setdefault("limit", failure.limit)
        return cls.failure(failure.kind, failure.message, **extra)


EXPLANATION_LIMIT = 4000
"""Characters of one explanation kept (a judge that writes an essay is cut, saying how much was)."""


def explanation(text: str) -> str:
    if len(text) <= EXPLANATION_LIMIT:
        return text
    return text[:EXPLANATION_LIMIT] + f"... ({len(text) - EXPLANATION_LIMIT} more characters)"


class PartOutcomes:
    """The outcomes of a composite reward's parts for one sample, by part name, and the composite's outcome
    made of them: their scores as sub-scores, their metrics as ``part/metric``, their output and explanations
    under their names (the OpenAI multi grader and Vertex's composite)."""

    def __init__(self, parts: dict[str, RewardOutcome]):
        self.parts = parts
        self.sub_scores = {k: o.score for k, o in parts.items() if o.ok and o.score is not None}

    def failed(self) -> tuple[str, RewardOutcome] | None:
        """The first part that failed, with its name."""
        return next(((k, o) for k, o in self.parts.items() if not o.ok), None)

    def outcome(
        self,
        latency_s: float,
        score: float | None = None,
        error: tuple[ErrorKind, str] | None = None,
        **extra: Any,
    ) -> RewardOutcome:
        """The composite's ``score``, or its failure ``(kind, message)``; ``extra``: ``limit``, ``warnings``."""
        common: dict[str, Any] = {
            "sub_scores": self.sub_scores,
            "metrics": {f"{k}/{m}": v for k, o in self.parts.items() for m, v in o.metrics.items()},
            "latency_s": latency_s,
            "stdout": self._stdout(),
            "explanations": self._explanations(),
            **extra,
        }
        if error is not None:
            return RewardOutcome.failure(error[0], error[1], **common)
        return RewardOutcome(score=score, **common)

    def _explanations(self) -> dict[str, str]:
        """Each part's explanation under its name (``part/grader`` when a part has several of its own)."""
        merged = {}
        for key, outcome in self.parts.items():
            for name, text in outcome.explanations.items():
                merged[key if len(outcome.explanations) == 1 else f"{key}/{name}"] = text
        return merged

    def _stdout(self) -> str:
        """The output of the parts' user code, each block headed by the part's name."""
        blocks = [
            f"[{name}]\n{o.stdout}" + ("" if o.stdout.endswith("\n") else "\n")
            for name, o in self.parts.items()
            if o.stdout
        ]
        return "".join(blocks)


SCORE_LIMIT = 1e6
"""Scores, sub-scores and metrics must lie in [-SCORE_LIMIT, SCORE_LIMIT]: group statistics square them
in float32 (max 3.4e38), so 1e308 or 10**400 would overflow a training step. Documented in docs/rewards.md."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:20] + f"...({len(text)} characters)"


def as_score(value: Any, what: str) -> float:
    """A finite float in [-SCORE_LIMIT, SCORE_LIMIT] from a reward's answer, or RewardFailure(invalid_output)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardFailure("invalid_output", f"{what} returned {_shown(value)} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if not -SCORE_LIMIT <= number <= SCORE_LIMIT:  # NaN fails this too
        raise RewardFailure(
            "invalid_output",
            f"{what} returned {_shown(value)}, not a finite number in [-{SCORE_LIMIT:g}, {SCORE_LIMIT:g}]",
        )
    return number


def checked(outcome: RewardOutcome, what: str) -> RewardOutcome:
    """The outcome, or an ``invalid_output`` failure when its score, a sub-score or a metric is not a number in
    range: the last guard before scores reach the training step, whatever reward kind made them."""
    if not outcome.ok:
        return outcome
    try:
        if outcome.score is not None:
            outcome.score = as_score(outcome.score, what)
        for table, name in ((outcome.sub_scores, "sub-score"), (outcome.metrics, "metric")):
            for key, value in table.items():
                table[key] = as_score(value, f"{what} {name} {key}")
    except RewardFailure as failure:
        return RewardOutcome.of_failure(failure, latency_s=outcome.latency_s)
    return outcome


class RewardFunction(Protocol):
    name: str
    requires_reference: bool

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]: ...

    async def aclose(self) -> None: ...
