"""Multi-turn rollouts: a generator that lets the model call tools until it answers.

``ToolGenerator`` wraps any generator (in-process, a replica thread's, a remote server's) and keeps its
interface: ``generate(prompts, params, seed)`` returns ``params.n`` completions per prompt, each now a
whole episode. Each prompt is a ``RowPrompt``: its token ids and the dataset row they were rendered from,
so rows are found by what they are, never by their tokens (rows with the same prompt keep their own data).

An episode: the environment (when the job has one) is made and ``reset`` with the row, and may open the
conversation with observation messages; the model writes its first turn (the ``n`` episodes of a prompt
without an observation share one prefill); then, turn by turn, the calls each episode's last turn made
run (concurrently across episodes), their results go back as ``tool`` messages through the chat template,
and every episode still going generates its next turn. An episode ends at an answer without a call, after
``max_turns`` model turns, when the token budget (``params.max_new_tokens``, tool results included) is
spent, when a tool cannot answer, or when the environment's ``step`` says it is done. The environment is
closed at the end whatever happened.

The episode's tokens: the model's own (``loss_mask`` 1, with their log-probs) and the tool results with
the chat template's tokens around them (``loss_mask`` 0, log-prob 0), computed from the template itself
(``openrft.tools.continuation``), so the model's sampled tokens are never re-tokenized.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from openrft.calls.endpoints import EndpointDown, gather_all
from openrft.calls.failures import CallFailure
from openrft.data.records import Example, without_thinking
from openrft.rollout.harmony import MARKERS as HARMONY_MARKERS
from openrft.rollout.prompts import render_prompt, template_arguments
from openrft.rollout.replicas import GeneratorReplica
from openrft.rollout.tool_calls import CALL_MARKERS, parse_tool_calls, tool_names
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams, WrappedGenerator
from openrft.spec.call_options import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.continuation import ToolTemplateError, call_id, continuation_ids
from openrft.tools.results import CallContext, ToolResult
from openrft.tools.runners import ToolBox
from openrft.tools.scheduler import EpisodeScheduler

T = TypeVar("T")
MAX_CHARS_PER_TOKEN = 16
"""A bound on the characters of one token, for cutting tool content to a token budget before tokenizing it."""
CALL_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"|to=functions\.([^\s<]+)|\[TOOL_CALLS\]\s*(\w+)')


class RowPrompt(list):
    """A prompt's token ids (a list) that carry the dataset row they were rendered from and its index."""

    example: Example
    index: int

    def __init__(self, ids: list[int], example: Example, index: int):
        super().__init__(ids)
        self.example, self.index = example, index


def row_prompts(examples: list[Example], prompt_ids: list[list[int]], start: int = 0) -> list[RowPrompt]:
    """Each prompt with its row (``start``: the index of the first row)."""
    return [RowPrompt(ids, example, start + i) for i, (example, ids) in enumerate(zip(examples, prompt_ids))]


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
        return await ToolBox(spec, sandbox).start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the tools run on (the episode scheduler submits each episode's calls to it)."""
        return self._loop

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
    rejected: int = 0  # calls over max_calls_per_turn, answered with an error and not run
    environment_done: bool = False
    close_error: str | None = None

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
            "rejected": self.rejected,
            "environment_done": self.environment_done,
            "close_error": self.close_error,
        }


@dataclass
class Episode:
    example: Example
    prompt_ids: list[int]
    budget: int
    episode_id: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)  # opening observation, then the episode's messages
    opened: bool = False  # the environment's reset gave opening messages: the prompt is the episode's own
    pending: list[dict[str, Any]] = field(default_factory=list)  # the calls of the last turn, not yet run
    refused: dict[str, str] = field(default_factory=dict)  # call id -> the error that answers it (not run)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # per model turn, from the environment's steps
    finish_reason: str | None = None
    failure: tuple[str, str] | None = None
    final_text: str = ""
    environment: Any = None
    environment_reward: float | None = None
    environment_state: Any = None

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

    def fail(self, failure: CallFailure) -> None:
        if self.failure is None:
            self.failure = (failure.kind, failure.message)
        self.finish_reason = self.finish_reason or "tool_error"
        self.pending = []

    def completion(self, policy_version: int) -> Completion:
        metadata: dict[str, Any] = {"tools": self.stats.as_dict(), "episode_id": self.episode_id}
        if self.failure is not None:
            metadata["tool_failure"] = list(self.failure)
        if self.environment_reward is not None:
            metadata["environment_reward"] = self.environment_reward
        if self.environment_state is not None:
            metadata["environment_state"] = self.environment_state
        if any(self.turn_rewards):
            metadata["turn_rewards"] = list(self.turn_rewards)
        return Completion(
            prompt_ids=list(self.prompt_ids),
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text=without_reasoning(self.final_text),  # the turns keep it (the samples view)
            finish_reason=self.finish_reason or "length",
            policy_version=min(self.versions) if self.versions else policy_version,
            metadata=metadata,
            loss_mask=self.loss_mask,
            turns=self.turns,
        )


def without_reasoning(text: str) -> str:
    """The answer without the model's reasoning: ``<think>...</think>`` spans removed, and what comes before a
    lone ``</think>`` (a template that opens the block in the prompt), so graders see the answer alone."""
    text = without_thinking(text)
    if "</think>" in text:
        text = text.rpartition("</think>")[2]
    return text.strip()


def decode_turn(tokenizer, tokens: list[int], eos_token_ids: set[int], skip_special_tokens: bool = True) -> str:
    """A model turn's text, without its end token."""
    if tokens and tokens[-1] in eos_token_ids:
        tokens = tokens[:-1]
    return tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)


def call_text(tokenizer, text: str, tokens: list[int], eos_token_ids: set[int]) -> str:
    """The text a turn's calls are read from: the turn's text, or the turn with its special tokens kept when
    those hold the call markup (Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``, harmony's
    channels are special tokens of their tokenizers)."""
    raw = decode_turn(tokenizer, tokens, eos_token_ids, skip_special_tokens=False)
    markers = (*CALL_MARKERS, *HARMONY_MARKERS)
    return raw if any(m in raw and m not in text for m in markers) else text


def _row(prompt: list[int]) -> tuple[Example, int]:
    if not isinstance(prompt, RowPrompt):
        raise TypeError(
            "a tool episode starts from a RowPrompt (the prompt's tokens and its dataset row: "
            "openrft.tools.episodes.row_prompts); this prompt is a plain list of token ids"
        )
    return prompt.example, prompt.index


class ToolGenerator(WrappedGenerator):
    """A generator whose completions are whole tool-using episodes (see the module docstring)."""

    def __init__(
        self,
        inner: Any,
        service: ToolService,
        tokenizer,
        eos_token_ids: list[int],
        reasoning_effort: str | None = None,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ToolTemplateError("multi-turn rollouts with tools need a model whose tokenizer has a chat template")
        self.inner, self.service, self.tokenizer = inner, service, tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.reasoning_effort = reasoning_effort
        self.spec = service.spec
        self.max_turns = service.spec.max_turns

    # episodes (the rest of the Generator interface is the inner generator's: WrappedGenerator) ----------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        groups: list[list[Episode]] = []
        for prompt in prompts:
            example, index = _row(prompt)
            budget = params.completion_limit(len(prompt))  # the whole episode: max_new_tokens, within max_length
            groups.append(
                [Episode(example, list(prompt), budget, f"{index}-{uuid.uuid4().hex[:16]}") for _ in range(params.n)]
            )
        flat = [e for group in groups for e in group]
        try:
            self.service.run(self._start_environments(flat))
            for episode in flat:
                if episode.opened:
                    episode.budget = params.completion_limit(len(episode.prompt_ids))
            if self.spec.schedule == "independent":
                EpisodeScheduler(self, params, seed).run(prompts, groups)
            else:
                self._lockstep(prompts, groups, params, seed)
            self.service.run(self._finish_environments(flat))
        finally:
            self.service.run(self._close_environments(flat))
        version = self.inner.policy_version
        return [[e.completion(version) for e in group] for group in groups]

    def _lockstep(
        self, prompts: list[list[int]], groups: list[list[Episode]], params: SamplingParams, seed: int | None
    ) -> None:
        """Every episode's turn ``k`` in one batch, once every call of turn ``k - 1`` has come back."""
        flat = [e for group in groups for e in group]
        self.first_turns(prompts, groups, params, seed)
        turn = 1
        while True:
            self.service.run(self._run_calls([e for e in flat if e.pending]))
            for episode in flat:
                self.after_calls(episode)
            going = [e for e in flat if not e.done]
            if not going:
                break
            self.next_turns(going, params, None if seed is None else seed + 7919 * turn)
            turn += 1

    def after_calls(self, episode: Episode) -> None:
        """Once an episode's calls have come back: their messages (and the next turn's opening) appended. A
        template that cannot render them ends this episode only (``template_error``)."""
        if episode.pending and not episode.done:
            try:
                self._tool_turn(episode)
            except Exception as exc:  # jinja's raise_exception, a TypeError in the template, ToolTemplateError
                episode.fail(CallFailure("template_error", self._template_failure(episode, exc)))
        episode.pending, episode.refused = [], {}

    def _template_failure(self, episode: Episode, exc: Exception) -> str:
        calls = [c["function"]["name"] for c in episode.pending]
        model = getattr(self.tokenizer, "name_or_path", "") or "the model"
        return (
            f"the chat template of {model} failed on the tool results of turn {episode.stats.turns} "
            f"({len(calls)} call(s): {', '.join(calls)}): {type(exc).__name__}: {exc}"
        )

    def next_turns(self, episodes: list[Episode], params: SamplingParams, seed: int | None) -> None:
        """One later model turn of each episode, sampled in one call of the generator."""
        turn_params = replace(params, n=1, max_new_tokens=max(e.remaining for e in episodes))
        sampled = self.inner.generate([e.context for e in episodes], turn_params, seed)
        for episode, (completion,) in zip(episodes, sampled):
            self._model_turn(episode, completion)

    def first_turns(
        self, prompts: list[list[int]], groups: list[list[Episode]], params: SamplingParams, seed: int | None
    ) -> None:
        """The first model turn: the ``n`` episodes of a prompt from one shared prefill, unless an episode's
        environment opened the conversation (then each such episode from its own prompt)."""
        shared = [i for i, group in enumerate(groups) if not any(e.opened for e in group)]
        if shared:
            sampled = self.inner.generate([list(prompts[i]) for i in shared], params, seed)
            for i, completions in zip(shared, sampled):
                for episode, completion in zip(groups[i], completions):
                    if not episode.done:
                        self._model_turn(episode, completion)
        own = [e for i, group in enumerate(groups) if i not in set(shared) for e in group if not e.done]
        if own:
            own_params = replace(params, n=1, max_new_tokens=max(e.remaining for e in own))
            own_seed = None if seed is None else seed + 7907
            for episode, (completion,) in zip(own, self.inner.generate([e.context for e in own], own_params, own_seed)):
                self._model_turn(episode, completion)

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
        episode.turn_rewards.append(0.0)
        turn = episode.stats.turns
        text = completion.text if finish == completion.finish_reason else self._decode(tokens)
        try:
            call_text = self._call_text(text, tokens)
            parsed = parse_tool_calls(call_text, episode.offered)
        except Exception as exc:  # a parser failure ends this episode only
            episode.turns.append({"role": "assistant", "content": text})
            episode.final_text = text
            message = f"the tool calls of turn {turn} could not be parsed: {type(exc).__name__}: {exc}"
            episode.fail(CallFailure("parse_error", message))
            return
        calls = [{**c, "id": call_id(turn, i)} for i, c in enumerate(parsed.calls)]
        episode.stats.malformed += len(parsed.malformed)
        if self.spec.malformed_call_message is not None:
            for block in parsed.malformed:  # answered with an error message, so the model learns the format
                refused = self._refused_call(block, call_id(turn, len(calls)))
                episode.refused[refused["id"]] = self.spec.malformed_call_message.format(
                    error="the call's arguments are not a JSON object or its markup is broken"
                )
                calls.append(refused)
        for extra in calls[self.spec.max_calls_per_turn :]:
            episode.refused.setdefault(
                extra["id"], f"error: at most {self.spec.max_calls_per_turn} tool calls run per turn; this one did not"
            )
            episode.stats.rejected += 1
        content = parsed.content if calls or call_text is not text else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        episode.turns.append(message)
        episode.final_text = content
        if not calls:
            episode.finish_reason = finish
        elif finish != "stop":
            episode.finish_reason = "length"
        elif turn >= self.max_turns:
            episode.finish_reason = "max_turns"
        else:
            episode.pending = calls

    @staticmethod
    def _refused_call(block: str, id: str) -> dict[str, Any]:
        """A call block that could not be read, as a call (its text as the arguments) to answer with an error."""
        match = CALL_NAME.search(block)
        name = next((g for g in match.groups() if g), "invalid") if match else "invalid"
        return {"id": id, "type": "function", "function": {"name": name, "arguments": block}}

    def _decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return decode_turn(self.tokenizer, tokens, self.eos_token_ids, skip_special_tokens)

    def _call_text(self, text: str, tokens: list[int]) -> str:
        return call_text(self.tokenizer, text, tokens, self.eos_token_ids)

    async def _start_environments(self, episodes: list[Episode]) -> None:
        factory = self.service.box.environment
        if factory is None:
            return

        async def start(episode: Episode) -> None:
            example = episode.example
            try:
                episode.environment, opening = await factory.start({"id": example.id, **example.row()})
            except CallFailure as failure:
                episode.fail(failure)
                return
            if opening:
                episode.turns = opening
                episode.opened = True
                try:
                    episode.prompt_ids = render_prompt(
                        self.tokenizer, [*example.messages, *opening], example.tools, self.reasoning_effort
                    )
                except Exception as exc:
                    what = f"{type(exc).__name__}: {exc}"
                    message = f"the chat template failed on the environment's opening messages: {what}"
                    episode.fail(CallFailure("template_error", message))

        await gather_all(start(e) for e in episodes)

    async def _finish_environments(self, episodes: list[Episode]) -> None:
        factory = self.service.box.environment
        if factory is None:
            return

        async def finish(episode: Episode) -> None:
            if episode.environment is None or episode.failure is not None:
                return
            try:
                episode.environment_reward = await factory.final_reward(episode.environment, episode.messages())
                episode.environment_state = await factory.state(episode.environment)
            except CallFailure as failure:
                episode.failure = (failure.kind, failure.message)

        await gather_all(finish(e) for e in episodes)

    async def _close_environments(self, episodes: list[Episode]) -> None:
        box = self.service.box

        async def close(episode: Episode) -> None:
            await box.end_episode(episode.episode_id)
            if episode.environment is not None and box.environment is not None:
                episode.stats.close_error = await box.environment.close(episode.environment)
                episode.environment = None

        await asyncio.gather(*(close(e) for e in episodes))

    async def _run_calls(self, episodes: list[Episode]) -> None:
        box = self.service.box

        async def one(episode: Episode, call: dict[str, Any]) -> tuple[Episode, dict[str, Any], ToolResult]:
            refusal = episode.refused.get(call["id"])
            if refusal is not None:
                return episode, call, ToolResult(content=refusal, error_kind="refused")
            context = CallContext(
                episode.example.id, episode.messages(), episode.environment, episode.episode_id, episode.stats.turns
            )
            name = call["function"]["name"]
            try:
                arguments = json.loads(call["function"]["arguments"])
                return episode, call, await box.call(name, arguments, call["id"], episode.offered, context)
            except EndpointDown:  # an endpoint down for every input: the job cannot go on (named)
                raise
            except Exception as exc:  # whatever a runner did not expect ends this episode only
                message = f"tool {name}: {type(exc).__name__}: {exc}"
                return episode, call, ToolResult(content=message, error_kind="runtime_error", fatal=True)

        results = await gather_all(one(e, c) for e in episodes if not e.done for c in e.pending)
        for episode, call, result in results:
            name = call["function"]["name"]
            if result.error_kind != "refused":
                episode.stats.record(name, result)
            if result.fatal and episode.failure is None:
                episode.failure = (result.error_kind or "runtime_error", result.content)
                episode.finish_reason = "tool_error"
            if result.reward is not None:
                episode.turn_rewards[-1] += result.reward
            if result.done and not episode.done:
                episode.stats.environment_done = True
                episode.finish_reason = "stop"  # the environment ended the episode: no further model turn
            content = self._within_budget(result.content, episode.remaining)
            episode.turns.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": content})

    def _within_budget(self, content: str, remaining: int) -> str:
        """A tool's content cut to the episode's remaining tokens: what does not fit is never templated or
        tokenized whole (a first cut at ``MAX_CHARS_PER_TOKEN`` characters a token keeps that cheap)."""
        head = content[: max(remaining, 1) * MAX_CHARS_PER_TOKEN]
        ids = self.tokenizer(head, add_special_tokens=False)["input_ids"]
        return head if len(ids) <= remaining else self.tokenizer.decode(ids[: max(remaining, 0)])

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
    with_rows(parts)
    service = ToolService(spec.tools, spec.reward.sandbox)

    def episodes(generator) -> ToolGenerator:
        return ToolGenerator(generator, service, parts.tokenizer, parts.eos_ids, spec.sampling.reasoning_effort)

    return service, wrapper(episodes)


def with_rows(parts) -> None:
    """The job's prompts as ``RowPrompt``s (each with its dataset row), as episodes start from."""
    datasets = parts.datasets
    parts.train_prompts[:] = row_prompts(datasets.train, parts.train_prompts)
    parts.val_prompts[:] = row_prompts(datasets.validation, parts.val_prompts, start=len(datasets.train))


def wrapper(episodes: Any) -> Any:
    """A function that wraps a generator, an in-process replica's generator, or a replica (a Ray actor) so
    that its completions are whole episodes, each made by ``episodes(generator)`` (a ToolGenerator, or an
    agent's: ``tools.agent_generator``)."""

    def wrap(generator):
        if isinstance(generator, GeneratorReplica):
            generator.generator = wrap(generator.generator)
            return generator
        if callable(getattr(generator, "generate", None)) and hasattr(generator, "name"):
            return ToolReplica(generator, episodes)  # a GenerationReplica: generate(prompts, params, rng_state)
        return episodes(generator)

    return wrap
