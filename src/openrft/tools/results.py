"""What a tool call carries and gives back, shared by every runner (``runners``, ``mcp``) and the episodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openrft.errors import OpenRFTError


class ToolConfigError(OpenRFTError):
    """A tool's configuration cannot work (a module that does not import, a missing function or class)."""


@dataclass
class ToolResult:
    content: str
    error_kind: str | None = None  # a RewardOutcome error kind, or "tool_error" / "unknown_tool"
    fatal: bool = False
    latency_s: float = 0.0
    done: bool = False  # an environment ended the episode
    reward: float | None = None  # an environment's reward for the turn

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass
class CallContext:
    """What a runner may send along with a call: the row's id, the episode's, the model turn that made the
    call (1 = the first) and the conversation so far."""

    example_id: str
    messages: list[dict[str, Any]]
    environment: Any = None  # this episode's Environment instance, when the job has one
    episode_id: str = ""
    turn: int = 0
