"""One trajectory of a user's own agent: the turns it sampled through the agent routes, kept as token ids.

Turn 1: the agent's messages (and tools) rendered with the model's chat template are the trajectory's prompt.
Every turn's sampled token ids and log-probs are appended as the model produced them (loss mask 1). A later
Sample's messages must extend what was recorded: the previous request's messages followed by the assistant
message the route answered with (compared after ``normal``: content, calls by name and parsed arguments, the
call a tool message answers). What the agent added after that (tool results, a user message) becomes the
chat template's continuation (``tools.continuation``: the template's own tokens between turns), loss mask 0;
the model's sampled tokens are never re-tokenized.

A Sample that does not extend the record (the agent edited, dropped or summarised messages, changed its tools,
or went on after a turn cut at the token budget) is answered from a fresh rendering of its messages, so the
agent is unaffected, and the trajectory is dropped from training and counted (``history_changed``): its tokens
could not be what the model was trained on. The same request again (a client's retry after a lost answer)
gets the same answer, sampled once.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from openrft.data.records import Example
from openrft.rollout.prompts import render_prompt
from openrft.rollout.tool_calls import parse_tool_calls, tool_names
from openrft.rollout.types import Completion
from openrft.tools.continuation import call_id, continuation_ids
from openrft.tools.episodes import EpisodeStats, call_text, decode_turn, template_arguments, without_reasoning


class TrajectoryError(Exception):
    """A request the trajectory cannot take: HTTP ``status`` and a message naming why."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(frozen=True)
class Renderer:
    """What turning messages into tokens needs: the job's tokenizer, its end tokens and reasoning setting."""

    tokenizer: Any
    eos_token_ids: frozenset[int]
    reasoning_effort: str | None = None


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: the text ones, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def normal(message: dict[str, Any]) -> tuple:
    """What of a message the record depends on, comparable whichever way the agent wrote it back (the
    ``openai`` client's message object dumped, or a dict of its own): role, content (``None`` as empty, parts
    joined, outer spaces ignored), each call's name and parsed arguments, the call a tool message answers."""
    calls = tuple(
        (
            c.get("function", {}).get("name"),
            json.dumps(_arguments(c.get("function", {}).get("arguments")), sort_keys=True),
        )
        for c in message.get("tool_calls") or ()
    )
    return (message.get("role"), _text(message.get("content")).strip(), calls, message.get("tool_call_id"))


def plain_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat template takes it: known keys only, calls' arguments as the template wants."""
    out: dict[str, Any] = {"role": message.get("role"), "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            template_arguments(
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": c.get("function", {}).get("name"),
                        "arguments": c.get("function", {}).get("arguments"),
                    },
                }
            )
            for c in message["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


@dataclass
class TurnPlan:
    """What one Sample asks of the model: its context's token ids, the most tokens it may write, and
    whether its turn is recorded (False once the trajectory is dropped or its budget is spent)."""

    context: list[int]
    max_new_tokens: int
    recorded: bool
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    masked: list[int] = field(default_factory=list)  # the continuation ids this turn appends before sampling


@dataclass
class Trajectory:
    id: str
    example: Example
    row_index: int
    sample_index: int
    attempt: int
    max_new_tokens: int  # the trajectory's token budget (sampling.max_new_tokens), continuations included
    max_length: int | None
    prompt_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)  # what the trajectory added after its prompt
    versions: list[int] = field(default_factory=list)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    tools: list[dict[str, Any]] | None = None
    recorded: list[tuple] = field(default_factory=list)  # ``normal`` of every message the record holds
    history: list[dict[str, Any]] = field(default_factory=list)  # the same messages, as the template takes them
    last_request: tuple | None = None
    last_answer: dict[str, Any] | None = None
    final_text: str = ""
    finish_reason: str | None = None
    cut: bool = False  # a turn was cut at the budget: nothing can follow it in the record
    completed: bool = False
    status: str = "ready"
    rewards: list[float] | None = None
    reward_token: str | None = None
    failure: tuple[str, str] | None = None
    busy: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def budget(self) -> int:
        if self.max_length is None:
            return self.max_new_tokens
        return max(0, min(self.max_new_tokens, self.max_length - len(self.prompt_ids)))

    @property
    def remaining(self) -> int:
        return self.budget - len(self.token_ids)

    def fail(self, kind: str, message: str) -> None:
        if self.failure is None:
            self.failure = (kind, message)

    # a Sample ------------------------------------------------------------------------------------

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, asked: int | None, r: Renderer):
        """The context of this Sample (see the module docstring); raises ``TrajectoryError`` for a request the
        trajectory cannot take at all."""
        if self.completed:
            raise TrajectoryError(409, f"trajectory {self.id} is complete (CompleteRollout): no further turns")
        if not messages:
            raise TrajectoryError(400, "messages is empty", "messages")
        key = (tuple(normal(m) for m in messages), json.dumps(tools, sort_keys=True))
        if key == self.last_request and self.last_answer is not None:
            return None  # a retry of the last Sample: its answer again
        self.last_request, self.last_answer = key, None
        if not self.prompt_ids:  # the first turn: the prompt
            self.tools = tools
            self.prompt_ids = render_prompt(
                r.tokenizer, [plain_message(m) for m in messages], tools, r.reasoning_effort
            )
            self.recorded = list(key[0])
            self.history = [plain_message(m) for m in messages]
            return self._planned(self.prompt_ids, asked, messages, tools)
        extends = (
            not self.cut
            and key[1] == json.dumps(self.tools, sort_keys=True)
            and len(key[0]) > len(self.recorded)
            and list(key[0][: len(self.recorded)]) == self.recorded
        )
        if not extends:
            self._history_changed(messages, tools)
            fresh = render_prompt(r.tokenizer, [plain_message(m) for m in messages], tools, r.reasoning_effort)
            return TurnPlan(fresh, max(1, asked or self.max_new_tokens), False, messages, tools)
        added = [plain_message(m) for m in messages[len(self.recorded) :]]
        after = [*self.history, *added]
        last = self.token_ids[-1] if self.token_ids else None
        ids = continuation_ids(r.tokenizer, self.history, after, tools, r.reasoning_effort, last)
        self.recorded = list(key[0])
        self.history = after
        self.turns += added
        plan = self._planned([*self.prompt_ids, *self.token_ids, *ids], asked, messages, tools, masked=ids)
        return plan

    def _planned(self, context, asked, messages, tools, masked=()) -> TurnPlan:
        room = self.remaining - len(masked)
        recorded = self.failure is None and room > 0
        if room <= 0:  # the budget is spent: the turn is answered empty, "length", and ends the record
            self.cut = True
            self.finish_reason = "length"
        return TurnPlan(list(context), max(0, min(room, asked or room)), recorded, messages, tools, list(masked))

    def _history_changed(self, messages: list[dict[str, Any]], tools: Any) -> None:
        why = (
            "a turn was cut at the trajectory's token budget, so nothing can follow it"
            if self.cut
            else "its tools changed"
            if json.dumps(tools, sort_keys=True) != json.dumps(self.tools, sort_keys=True)
            else f"its messages do not start with the {len(self.recorded)} recorded ones (the agent's earlier "
            "messages and the model's answers as sent)"
        )
        self.fail(
            "history_changed", f"turn {self.stats.turns + 1} of trajectory {self.id} does not extend the record: {why}"
        )

    def record(self, plan: TurnPlan, completion: Completion | None, r: Renderer) -> dict[str, Any]:
        """Append a sampled turn (``None``: the budget was spent, nothing sampled) and return the assistant
        message and finish reason the route answers with."""
        tokens = list(completion.token_ids) if completion else []
        logprobs = list(completion.logprobs) if completion else []
        finish = completion.finish_reason if completion else "length"
        if len(tokens) > plan.max_new_tokens:  # sampled in a batch with a larger limit
            tokens, logprobs, finish = tokens[: plan.max_new_tokens], logprobs[: plan.max_new_tokens], "length"
        text = decode_turn(r.tokenizer, tokens, r.eos_token_ids)
        offered = tool_names(plan.tools)
        turn = self.stats.turns + 1
        parsed = parse_tool_calls(call_text(r.tokenizer, text, tokens, r.eos_token_ids), offered)
        calls = [{**c, "id": call_id(min(turn, 99), i)} for i, c in enumerate(parsed.calls)] if finish == "stop" else []
        content = parsed.content if calls else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        if plan.recorded:
            if plan.masked:
                self.token_ids += plan.masked
                self.logprobs += [0.0] * len(plan.masked)
                self.loss_mask += [0] * len(plan.masked)
            self.token_ids += tokens
            self.logprobs += logprobs
            self.loss_mask += [1] * len(tokens)
            if completion is not None:
                self.versions.append(completion.policy_version)
            self.recorded.append(normal(message))
            self.history.append(plain_message(message))
            self.turns.append(message)
            self.final_text = content
            self.finish_reason = finish
            if finish != "stop":
                self.cut = True
        self.stats.turns += 1
        for call in calls:
            name = call["function"]["name"]
            self.stats.calls[name] = self.stats.calls.get(name, 0) + 1
        answer = {
            "message": message,
            "finish_reason": "tool_calls" if calls else finish,
            "tokens": tokens,
            "logprobs": logprobs,
        }
        self.last_answer = answer
        return answer

    # CompleteRollout and UpdateReward ------------------------------------------------------------

    def complete(self, status: str) -> None:
        if self.completed and status != self.status:
            raise TrajectoryError(409, f"trajectory {self.id} was already completed with status {self.status!r}")
        self.completed, self.status = True, status

    def set_reward(self, rewards: list[float], token: str | None) -> None:
        if not self.completed:
            raise TrajectoryError(
                409, f"trajectory {self.id} is not complete: call CompleteRollout before UpdateReward"
            )
        if self.rewards is not None:
            if token is not None and token == self.reward_token and rewards == self.rewards:
                return  # the same request again (its ClientToken): nothing changes
            raise TrajectoryError(409, f"trajectory {self.id} already has its reward")
        if not rewards or not all(isinstance(v, int | float) and math.isfinite(v) for v in rewards):
            raise TrajectoryError(
                400, f"Rewards must be a non-empty list of finite numbers, not {rewards!r}", "Rewards"
            )
        self.rewards, self.reward_token = [float(v) for v in rewards], token

    # the training record -------------------------------------------------------------------------

    def completion(self, policy_version: int) -> Completion:
        """The trajectory as the training record the built-in tool loop makes (``Episode.completion``)."""
        metadata: dict[str, Any] = {
            "tools": self.stats.as_dict(),
            "episode_id": self.id,
            "agent": {"trajectory_id": self.id, "attempt": self.attempt, "seconds": time.monotonic() - self.started},
        }
        if self.failure is not None:
            metadata["tool_failure"] = list(self.failure)
        if self.rewards is not None:
            metadata["agent_reward"] = sum(self.rewards)
            metadata["agent"]["rewards"] = list(self.rewards)
        return Completion(
            prompt_ids=list(self.prompt_ids),
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text=without_reasoning(self.final_text),
            finish_reason=self.finish_reason or "length",
            policy_version=min(self.versions) if self.versions else policy_version,
            metadata=metadata,
            loss_mask=self.loss_mask,
            turns=self.turns,
        )
