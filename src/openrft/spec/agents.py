"""Bring your own agent: ``rollout.agent``, the user's agent that the job drives for each row and sample.

The agent is an HTTP endpoint (``url``: a JSON POST per trajectory, as SageMaker's multi-turn RL calls an
AgentCore runtime or a Lambda forwarder) or, for operators, a Python callable (``callable``:
``package.module:function`` or ``file.py:function``). It is given the row, a ``base_url`` and a trajectory id;
it samples the model through OpenAI-compatible routes at that ``base_url`` (docs/agents.md). ``timeout``,
``max_retries`` and ``max_concurrency`` are the names of the Nova MTRL recipe's ``rollout`` block
(``spec/dialects/mtrl.py``); their bounds here are OpenRFT's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openrft.spec.urls import HttpUrl

MAX_AGENT_CONCURRENCY = 4096
MAX_AGENT_TIMEOUT_S = 86400.0  # the MTRL recipe's longest rollout.timeout


class AgentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    url: HttpUrl | None = Field(
        None, description="the agent's endpoint: POST {trajectory_id, base_url, api_key, row, ...} per trajectory"
    )
    callable: str | None = Field(
        None,
        min_length=3,
        description="operators: the agent as a Python function (package.module:function or file.py:function), "
        "called with the same request as a dict",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="sent with every POST to url")
    timeout: float = Field(
        600.0, gt=0, le=MAX_AGENT_TIMEOUT_S, description="seconds one trajectory may take, all its turns included"
    )
    max_retries: int = Field(
        3, ge=0, le=10, description="a failed trajectory is started again (a new trajectory id) this many times"
    )
    max_concurrency: int = Field(
        96, ge=1, le=MAX_AGENT_CONCURRENCY, description="trajectories in flight at once (agent calls open)"
    )
    await_reward: bool = Field(
        False,
        description="after CompleteRollout, wait (within timeout) for the agent's UpdateReward; without one the "
        "trajectory is dropped and counted. False: a trajectory without UpdateReward is scored by the job's reward",
    )
    batch_window_s: float = Field(
        0.02,
        ge=0.0,
        le=5.0,
        description="how long a Sample waits for other trajectories' Samples to join its batch (none wait once "
        "every running trajectory is waiting)",
    )
    error_budget: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="the share of a batch's trajectories that may be dropped (agent error, timeout, changed "
        "history); past it the job fails, naming the most frequent cause",
    )
    on_history_change: Literal["drop"] = Field(
        "drop",
        description="a Sample whose messages do not extend the trajectory's recorded turns is answered, and the "
        "trajectory is dropped from training and counted (history_changed)",
    )

    @model_validator(mode="after")
    def _one_entrypoint(self) -> AgentSpec:
        if (self.url is None) == (self.callable is None):
            raise ValueError(
                "rollout.agent needs exactly one of url (the agent's HTTP endpoint) and callable "
                "(package.module:function, operators only)"
            )
        if self.callable is not None and ":" not in self.callable:
            raise ValueError(
                f"rollout.agent.callable {self.callable!r} is not module:function (e.g. my_agent.py:run or "
                "my_package.agent:run)"
            )
        if self.headers and self.url is None:
            raise ValueError("rollout.agent.headers are sent to rollout.agent.url, which is not set")
        return self

    def relative_to(self, base_dir: Path) -> AgentSpec:
        """A ``file.py:function`` callable made absolute against the job file's directory."""
        if self.callable is None:
            return self
        module, sep, function = self.callable.rpartition(":")
        if module.endswith(".py"):
            return self.model_copy(update={"callable": f"{(base_dir / module).resolve()}{sep}{function}"})
        return self
