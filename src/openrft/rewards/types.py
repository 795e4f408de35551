"""The reward protocol: a batch of samples in, one outcome per sample out (async)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from openrft.data.records import Example

ErrorKind = Literal["parse_error", "timeout", "runtime_error", "server_error", "invalid_output"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("parse_error", "timeout", "runtime_error", "server_error", "invalid_output")


@dataclass
class RewardSample:
    """What a reward sees of one completion: the whole dataset example and the model's text."""

    example: Example
    completion: str
    step: int = 0
    sample_index: int = 0

    @property
    def prompt_messages(self) -> list[dict[str, Any]]:
        return self.example.messages


@dataclass
class RewardOutcome:
    """A score with optional named sub-scores and metrics, or an error of a named kind (never both)."""

    score: float | None
    sub_scores: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    latency_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @classmethod
    def failure(cls, kind: ErrorKind, message: str) -> RewardOutcome:
        return cls(score=None, error_kind=kind, error_message=message)


class RewardFunction(Protocol):
    name: str
    requires_reference: bool

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]: ...

    async def aclose(self) -> None: ...
