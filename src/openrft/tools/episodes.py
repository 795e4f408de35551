"""Multi-turn rollouts: a generator that lets the model call tools until it answers.

``ToolGenerator`` wraps any generator (in-process, a replica thread's, a remote server's) and keeps its
interface: ``generate(prompts, params, seed)`` returns ``params.n`` completions per prompt, each now a
whole episode. The first turn samples the ``n`` episodes of a prompt from one shared prefill; then, turn
by turn, the calls each episode's last turn made run (concurrently across episodes), their results go
back as ``tool`` messages through the chat template, and every episode still going generates its next
turn. An episode ends at an answer without a call, after ``max_turns`` model turns, when the token budget
(``params.max_new_tokens``, tool results included) is spent, or when a tool cannot answer.

The episode's tokens: the model's own (``loss_mask`` 1, with their log-probs) and the tool results with
the chat template's tokens around them (``loss_mask`` 0, log-prob 0). The template's part is found by
rendering the conversation with and without the tool messages and keeping the difference, so the model's
sampled tokens are never re-tokenized.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from openrft.data.records import Example
from openrft.errors import OpenRFTError
from openrft.rewards.remote import gather_all
from openrft.rewards.types import RewardFailure
from openrft.rewards.views import openai_item
from openrft.rollout.prompts import chat_text
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.spec.rewards import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.calls import parse_tool_calls, tool_names
from openrft.tools.runners import CallContext, ToolBox, ToolResult

T = TypeVar("T")


class ToolTemplateError(OpenRFTError):
    """The model's chat template cannot continue a conversation with tool results."""


class ToolService:
    """The job's ToolBox on one long-lived event loop thread, shared by every ToolGenerator of the job."""

    def __init__(self, spec: ToolsSpec, sandbox: SandboxSpec):
        self.spec = spec
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openrft-tools", daemon=True)
        self._thread.start()
        self.box: ToolBox = self.run(self._make(spec, sandbox))

    @staticmethod
    async def _make(spec: ToolsSpec, sandbox: SandboxSpec) -> ToolBox:
        return ToolBox(spec, sandbox)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self.box.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()


@dataclass
class EpisodeStats:
    turns: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    latency_s: dict[str, float] = field(default_factory=dict)
    malformed: int = 0

    def record(self, name: str, result: ToolResult) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.latency_s[name] = self.latency_s.get(name, 0.0) + result.latency_s
        if not result.ok:
            self.errors[name] = self.errors.get(name, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "calls": dict(self.calls),
            "errors": dict(self.errors),
            "latency_s": dict(self.latency_s),
            "malformed": self.malformed,
        }


def template_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A call as chat templates expect it in history: ``arguments`` a dict (transformers' convention)."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except (TypeError, ValueError):
        arguments = function["arguments"]
    return {**call, "function": {"name": function["name"], "arguments": arguments}}


@dataclass
class Episode:
    example: Example
    prompt_ids: list[int]
    budget: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)  # the calls of the last turn, not yet run
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    failure: tuple[str, str] | None = None
    final_text: str = ""
    environment: Any = None
    environment_reward: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.budget - len(self.token_ids)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    @property
    def offered(self) -> set[str]:
        return tool_names(self.example.tools)

    def messages(self) -> list[dict[str, Any]]:
        return [*self.example.messages, *self.turns]

    def completion(self) -> Completion:
        metadata: dict[str, Any] = {"tools": self.stats.as_dict()}
        if self.failure is not None:
            metadata["tool_failure"] = list(self.failure)
        if self.environment_reward is not None:
            metadata["environment_reward"] = self.environment_reward
        return Completion(
            prompt_ids=list(self.prompt_ids),
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text=self.final_text,
            finish_reason=self.finish_reason or "length",
            policy_version=min(self.versions),
            metadata=metadata,
            loss_mask=self.loss_mask,
            turns=self.turns,
        )


class ToolGenerator:
    """A generator whose completions are whole tool-using episodes (see the module docstring)."""

    def __init__(
        self,
        inner: Any,
        service: ToolService,
        tokenizer,
        examples: dict[tuple[int, ...], Example],
        eos_token_ids: list[int],
        reasoning_effort: str | None = None,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ToolTemplateError("multi-turn rollouts with tools need a model whose tokenizer has a chat template")
        self.inner, self.service, self.tokenizer = inner, service, tokenizer
        self.examples = examples
        self.eos_token_ids = set(eos_token_ids)
        self.reasoning_effort = reasoning_effort
        self.max_turns = service.spec.max_turns

    # the Generator interface, delegated -------------------------------------------------------------

    @property
    def rng(self):
        return self.inner.rng

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def set_policy_version(self, version: int) -> None:
        self.inner.set_policy_version(version)

    def load_adapter(self, weights, version: int) -> None:
        self.inner.load_adapter(weights, version)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    # episodes ------------------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        groups = self.inner.generate(prompts, params, seed)
        episodes: list[list[Episode]] = []
        for prompt, group in zip(prompts, groups):
            example = self.examples.get(tuple(prompt))
            if example is None:
                raise KeyError("a prompt of this job's datasets was expected; this one is unknown")
            budget = params.completion_limit(len(prompt))  # the whole episode: max_new_tokens, within max_length
            row = [Episode(example, list(prompt), budget) for _ in group]
            for episode, completion in zip(row, group):
                self._model_turn(episode, completion)
            episodes.append(row)
        flat = [e for row in episodes for e in row]
        self.service.run(self._start_environments(flat))
        turn = 1
        while True:
            self.service.run(self._run_calls([e for e in flat if e.pending]))
            for episode in flat:
                if episode.pending and not episode.done:
                    self._tool_turn(episode)
                episode.pending = []
            going = [e for e in flat if not e.done]
            if not going:
                break
            turn_params = replace(params, n=1, max_new_tokens=max(e.remaining for e in going))
            turn_seed = None if seed is None else seed + 7919 * turn
            next_turns = self.inner.generate([e.context for e in going], turn_params, turn_seed)
            for episode, (completion,) in zip(going, next_turns):
                self._model_turn(episode, completion)
            turn += 1
        self.service.run(self._finish_environments(flat))
        return [[e.completion() for e in row] for row in episodes]

    def _model_turn(self, episode: Episode, completion: Completion) -> None:
        """Append one sampled turn (cut to the budget) and decide: answer, calls to run, or the end."""
        tokens, logprobs = completion.token_ids, completion.logprobs
        finish = completion.finish_reason
        if len(tokens) > episode.remaining:  # sampled with the largest budget of the batch
            tokens, logprobs, finish = tokens[: episode.remaining], logprobs[: episode.remaining], "length"
        episode.token_ids += tokens
        episode.logprobs += logprobs
        episode.loss_mask += [1] * len(tokens)
        episode.versions.append(completion.policy_version)
        episode.stats.turns += 1
        text = completion.text if finish == completion.finish_reason else self._decode(tokens)
        parsed = parse_tool_calls(text, episode.offered, id_prefix=f"call_{episode.stats.turns}_")
        episode.stats.malformed += len(parsed.malformed)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content if parsed.calls else text}
        if parsed.calls:
            message["tool_calls"] = parsed.calls
        episode.turns.append(message)
        episode.final_text = message["content"]
        if not parsed.calls:
            episode.finish_reason = finish
        elif finish != "stop":
            episode.finish_reason = "length"
        elif episode.stats.turns >= self.max_turns:
            episode.finish_reason = "max_turns"
        else:
            episode.pending = parsed.calls

    def _decode(self, tokens: list[int]) -> str:
        if tokens and tokens[-1] in self.eos_token_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    async def _start_environments(self, episodes: list[Episode]) -> None:
        factory = self.service.box.environment
        if factory is None:
            return

        async def start(episode: Episode) -> None:
            try:
                episode.environment = await factory.start({"id": episode.example.id, **openai_item(episode.example)})
            except RewardFailure as failure:
                episode.failure = (failure.kind, failure.message)
                episode.finish_reason = "tool_error"
                episode.pending = []

        await gather_all(start(e) for e in episodes)

    async def _finish_environments(self, episodes: list[Episode]) -> None:
        factory = self.service.box.environment
        if factory is None:
            return

        async def finish(episode: Episode) -> None:
            if episode.environment is None or episode.failure is not None:
                return
            try:
                episode.environment_reward = await factory.final_reward(episode.environment)
            except RewardFailure as failure:
                episode.failure = (failure.kind, failure.message)

        await gather_all(finish(e) for e in episodes)

    async def _run_calls(self, episodes: list[Episode]) -> None:
        box = self.service.box

        async def one(episode: Episode, call: dict[str, Any]) -> tuple[Episode, dict[str, Any], ToolResult]:
            context = CallContext(episode.example.id, episode.messages(), episode.environment)
            name = call["function"]["name"]
            arguments = json.loads(call["function"]["arguments"])
            return episode, call, await box.call(name, arguments, call["id"], episode.offered, context)

        results = await gather_all(one(e, c) for e in episodes if not e.done for c in e.pending)
        for episode, call, result in results:
            episode.stats.record(call["function"]["name"], result)
            if result.fatal and episode.failure is None:
                episode.failure = (result.error_kind or "runtime_error", result.content)
                episode.finish_reason = "tool_error"
            name = call["function"]["name"]
            episode.turns.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": result.content})

    def _tool_turn(self, episode: Episode) -> None:
        """Append the tool messages' tokens (masked) and the start of the model's next turn."""
        calls = len(episode.pending)
        history = [*episode.example.messages, *(self._for_template(m) for m in episode.turns)]
        before = history[:-calls]
        ids = self.continuation(episode, before, history)
        if len(ids) >= episode.remaining:  # no room left for the model to write
            ids = ids[: episode.remaining]
            episode.finish_reason = "length"
        episode.token_ids += ids
        episode.logprobs += [0.0] * len(ids)
        episode.loss_mask += [0] * len(ids)

    @staticmethod
    def _for_template(message: dict[str, Any]) -> dict[str, Any]:
        if message.get("tool_calls"):
            return {**message, "tool_calls": [template_arguments(c) for c in message["tool_calls"]]}
        return message

    def continuation(self, episode: Episode, before: list[dict], after: list[dict]) -> list[int]:
        last = episode.token_ids[-1] if episode.token_ids else None
        return continuation_ids(self.tokenizer, before, after, episode.example.tools, self.reasoning_effort, last)


def continuation_ids(
    tokenizer,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reasoning_effort: str | None,
    last_token: int | None,
) -> list[int]:
    """Token ids that follow the model's end-of-turn token ``last_token``: the chat template's rendering of
    what ``after`` adds to ``before`` (the tool messages) and the next assistant turn's header."""
    head = chat_text(tokenizer, before, tools, reasoning_effort, add_generation_prompt=False)
    full = chat_text(tokenizer, after, tools, reasoning_effort, add_generation_prompt=True)
    if not full.startswith(head):
        raise ToolTemplateError(
            "the chat template renders a conversation differently once tool messages follow it, so the "
            "tool results cannot be appended to the model's tokens; use a template that renders history "
            "the same way whatever comes after it"
        )
    end = tokenizer.decode([last_token], skip_special_tokens=False) if last_token is not None else ""
    cut = head.rfind(end) if end else -1
    trailing = head[cut + len(end) :] if cut >= 0 else ""  # what the template writes after the end token
    return tokenizer(trailing + full[len(head) :], add_special_tokens=False)["input_ids"]


def examples_by_prompt(examples: list[Example], prompt_ids: list[list[int]]) -> dict[tuple[int, ...], Example]:
    """Each prompt's example, for the generator to find the tools (and the row) of the prompts it is given."""
    return {tuple(ids): example for example, ids in zip(examples, prompt_ids)}


class _ReplicaTurns(PolicyVersioned):
    """One model turn of every episode as one call of a generation replica (a Ray actor), threading the
    replica's random stream through the turns of a ``generate``."""

    def __init__(self, replica: Any):
        self.replica = replica
        self.rng_state: Any = None
        self.rng = None

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        groups, self.rng_state = self.replica.generate(prompts, params, self.rng_state)
        return groups

    def load_adapter(self, weights: Any, version: int) -> None:
        self.replica.load_adapter(weights, version)


class ToolReplica:
    """A generation replica (``GenerationReplica``: a Ray actor) whose completions are tool episodes; the
    turns are sampled on the replica, the tools run here."""

    def __init__(self, replica: Any, make: Any):
        self.replica, self.name = replica, replica.name
        self.turns = _ReplicaTurns(replica)
        self.episodes: ToolGenerator = make(self.turns)

    def load_adapter(self, weights: Any, version: int) -> None:
        self.replica.load_adapter(weights, version)

    def generate(self, prompts: list[list[int]], params: SamplingParams, rng_state: Any | None):
        self.turns.rng_state = rng_state
        return self.episodes.generate(prompts, params), self.turns.rng_state

    def close(self) -> None:
        self.replica.close()


def tool_generators(spec, parts) -> tuple[ToolService, Any]:
    """The job's ToolService and a function that wraps a generator, an in-process replica's generator, or
    a replica (a Ray actor) so that its completions are tool episodes. ``spec``: the JobSpec; ``parts``:
    its JobParts (tokenizer, datasets, prompts)."""
    from openrft.engine.async_rollouts import GeneratorReplica

    datasets = parts.datasets
    examples = examples_by_prompt(datasets.train + datasets.validation, parts.train_prompts + parts.val_prompts)
    service = ToolService(spec.tools, spec.reward.sandbox)

    def episodes(generator) -> ToolGenerator:
        return ToolGenerator(
            generator, service, parts.tokenizer, examples, parts.eos_ids, spec.sampling.reasoning_effort
        )

    def wrap(generator):
        if isinstance(generator, GeneratorReplica):
            generator.generator = wrap(generator.generator)
            return generator
        if callable(getattr(generator, "generate", None)) and hasattr(generator, "name"):
            return ToolReplica(generator, episodes)  # a GenerationReplica: generate(prompts, params, rng_state)
        return episodes(generator)

    return service, wrap
