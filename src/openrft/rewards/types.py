"""The reward protocol and its kinds: a batch of samples in, one outcome per sample out (async), and how a
reward configuration becomes a function that does that (``build_reward``).

A failed sample has an error kind, the same for every reward kind: those of any call to the outside
(``openrft.calls.failures``: ``parse_error``, ``timeout``, ``runtime_error``, ``server_error``,
``invalid_output``).

The kinds' registry: every module of ``rewards/kinds`` is a kind; its ``CONFIG`` class is its key, and
``build_reward`` is one lookup. What the reward functions of one job share (``RewardContext``: an HTTP client,
the sandbox pool, the LLM judge) is made here on first use, inside the event loop that uses it (the
RewardRunner's), and closed with the job's reward (``ManagedReward``). A kind asks the context for the pool
or the judge as it builds, with the path of the field that needs it: where this machine cannot isolate user
code, or no judge endpoint is set, the problem is reported at that path, in the same pass.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any, Protocol

import httpx

from openrft.calls.endpoints import RemoteEndpoint, async_client
from openrft.calls.failures import ERROR_KINDS as ERROR_KINDS  # re-exported: the kinds a reward fails with
from openrft.calls.failures import CallFailure, ErrorKind
from openrft.calls.sandbox import SandboxPool, SandboxUnavailable
from openrft.data.records import Example
from openrft.errors import RewardError
from openrft.rewards import kinds
from openrft.rewards.judge import JUDGE_TIMEOUT_S, NO_JUDGE_ENDPOINT, ChatJudge, judge_api_key, judge_base_url
from openrft.rewards.kinds import Needs
from openrft.rollout.tool_calls import parse_tool_calls, tool_names
from openrft.spec.errors import FieldProblem
from openrft.spec.rewards import RewardConfig, RewardSpec

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


# ------------------------------------------------------------------------------------------------
# the kinds' registry, and what a job's reward functions share


class Cancellable(Protocol):
    def attach(self) -> None:
        """Called inside the scoring coroutine: from then on, cancelling it cancels that coroutine's task."""


@functools.cache
def _kinds() -> dict[type, ModuleType]:
    found: dict[type, ModuleType] = {}
    for info in pkgutil.iter_modules(kinds.__path__):
        module = importlib.import_module(f"{kinds.__name__}.{info.name}")
        found[module.CONFIG] = module
    return found


def kind_of(config: RewardConfig) -> ModuleType:
    """The kind module that builds ``config``."""
    try:
        return _kinds()[type(config)]
    except KeyError:
        raise RewardError(f"reward type {config.type!r} is not available in this build") from None


def needs_of(config: RewardConfig) -> Needs:
    """The endpoints, files and privileges ``config`` needs (the service's tenancy rules read them)."""
    return kind_of(config).needs(config)


def check_source(source: str, entry: str, arity: int, path: str) -> list[FieldProblem]:
    """The problem of user code (run in the sandbox as ``entry(*args)`` with ``arity`` arguments) that does not
    compile or define ``entry`` as a plain top-level function taking them, at ``path``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [FieldProblem(path, f"is not valid Python: line {exc.lineno}: {exc.msg}")]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == entry:
            if isinstance(node, ast.AsyncFunctionDef):
                return [FieldProblem(path, f"defines {entry}() as async; it must be a plain function")]
            args = node.args
            positional = len(args.posonlyargs) + len(args.args)
            required = positional - len(args.defaults)
            if not (required <= arity and (positional >= arity or args.vararg is not None)):
                return [
                    FieldProblem(path, f"defines {entry}() with {positional} argument(s); it is called with {arity}")
                ]
            return []
    return [FieldProblem(path, f"defines no top-level function {entry}()")]


class RewardContext:
    def __init__(self, spec: RewardSpec):
        self.spec = spec
        self._clients: dict[bool, tuple[httpx.AsyncClient, asyncio.AbstractEventLoop]] = {}  # by operator's own
        self._pool: SandboxPool | None = None
        self._judge: ChatJudge | None = None
        self.endpoints: list[RemoteEndpoint] = []

    def client(self, operator: bool = False) -> httpx.AsyncClient:
        """The client of this loop for the job's own endpoints, or (``operator``) the operator's (the judge)."""
        loop = asyncio.get_running_loop()
        made = self._clients.get(operator)
        if made is None or made[1] is not loop:
            made = self._clients[operator] = (async_client(operator=operator), loop)
        return made[0]

    def endpoint(
        self,
        url: str,
        default_timeout_s: float,
        label: str,
        headers: dict[str, str] | None = None,
        operator: bool = False,
    ) -> RemoteEndpoint:
        """``operator``: the URL is the operator's (a tenant cannot set it), reached whatever a tenant may reach."""
        client = _LazyClient(self, operator)
        endpoint = RemoteEndpoint(url, self.spec.remote, default_timeout_s, label, client, headers)  # type: ignore[arg-type]
        self.endpoints.append(endpoint)
        return endpoint

    def pool(self, path: str, problems: list[FieldProblem]) -> SandboxPool | None:
        """The sandbox pool the user code at ``path`` runs in; None, with the problem appended at ``path``, where
        this machine cannot isolate it as ``reward.sandbox.isolation`` asks."""
        if self._pool is None:
            try:
                self._pool = SandboxPool(self.spec.sandbox)
            except SandboxUnavailable as exc:
                problems.append(FieldProblem(path, f"runs user code, but {exc.reason}"))
                return None
        return self._pool

    def judge(self, path: str, problems: list[FieldProblem]) -> ChatJudge | None:
        """The LLM judge of the grader at ``path``; None, with the problem appended, when no endpoint is set."""
        if self._judge is None:
            url = judge_base_url(self.spec.judge)
            if not url:
                problems.append(FieldProblem(path, NO_JUDGE_ENDPOINT))
                return None
            key = judge_api_key(self.spec.judge)
            headers = {"Authorization": f"Bearer {key}"} if key else None
            # judge.base_url is the operator's (tenant_config refuses it from tenants): the judge is theirs
            endpoint = self.endpoint(
                url.rstrip("/") + "/chat/completions", JUDGE_TIMEOUT_S, "LLM judge", headers, operator=True
            )
            self._judge = ChatJudge(endpoint, self.spec.judge)
        return self._judge

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        loop = asyncio.get_running_loop()
        for client, client_loop in self._clients.values():
            if client_loop is loop:
                await client.aclose()
        self._clients.clear()


class _LazyClient:
    """Stands in for an httpx client until the first request, made inside the running loop."""

    def __init__(self, context: RewardContext, operator: bool):
        self.context, self.operator = context, operator

    def build_request(self, *args, **kwargs) -> httpx.Request:
        return self.context.client(self.operator).build_request(*args, **kwargs)

    async def send(self, *args, **kwargs) -> httpx.Response:
        return await self.context.client(self.operator).send(*args, **kwargs)


class ManagedReward:
    """The job's reward function together with what its parts share; closing it closes them."""

    def __init__(self, function: RewardFunction, context: RewardContext):
        self.function = function
        self.context = context
        self.name = function.name
        self.requires_reference = function.requires_reference

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        return await self.function.score(samples)

    async def aclose(self) -> None:
        try:
            await self.function.aclose()
        finally:
            await self.context.aclose()

    def score_one(
        self, example: Example, response: str, step: int = 0, cancellation: Cancellable | None = None
    ) -> RewardOutcome:
        """Score one response (checked like a job's), then close: a reward tried once (``graders/run``,
        ``openrft rewards test``). A ``cancellation`` (the service's, when the client hangs up) stops it: its
        sandbox is killed and ``asyncio.CancelledError`` raised."""

        async def go() -> RewardOutcome:
            if cancellation is not None:
                cancellation.attach()
            try:
                started = time.perf_counter()
                outcome = checked((await self.score([RewardSample(example, response, step=step)]))[0], self.name)
                if outcome.latency_s is None:
                    outcome.latency_s = time.perf_counter() - started
                return outcome
            finally:
                await self.aclose()

        return asyncio.run(go())


def build_reward(spec: RewardSpec) -> ManagedReward:
    """The reward function of ``spec``, built by its kind in one pass; a ``SpecError`` lists every problem it
    found, each at its path under ``reward.function``."""
    context = RewardContext(spec)
    return ManagedReward(kind_of(spec.function).build(spec.function, spec, context), context)
