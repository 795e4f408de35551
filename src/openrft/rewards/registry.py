"""RewardSpec -> a RewardFunction: the config's class names its kind (``rewards/kinds/``), the kind builds it.

Every module of ``rewards/kinds`` is a kind; its ``CONFIG`` class is its key. Building checks what
pydantic could not (``SpecError`` naming each problem's path) before the job starts.

What the reward functions of one job share (``RewardContext``: an HTTP client, the sandbox pool, the LLM
judge) is built once per RewardSpec here and closed with the job's reward (``ManagedReward``). Each piece
is made on first use, inside the event loop that uses it (the RewardRunner's).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import pkgutil
import time
from types import ModuleType
from typing import Protocol

import httpx

from openrft.calls.endpoints import RemoteEndpoint, outbound_client
from openrft.calls.sandbox import SandboxPool
from openrft.data.records import Example
from openrft.errors import RewardError
from openrft.rewards import kinds
from openrft.rewards.judge import JUDGE_TIMEOUT_S, ChatJudge, judge_api_key, require_base_url
from openrft.rewards.kinds import Needs
from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample, checked
from openrft.spec.rewards import RewardConfig, RewardSpec


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


class RewardContext:
    def __init__(self, spec: RewardSpec):
        self.spec = spec
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._pool: SandboxPool | None = None
        self._judge: ChatJudge | None = None
        self.endpoints: list[RemoteEndpoint] = []

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = outbound_client()
            self._client_loop = loop
        return self._client

    def endpoint(
        self, url: str, default_timeout_s: float, label: str, headers: dict[str, str] | None = None
    ) -> RemoteEndpoint:
        endpoint = RemoteEndpoint(url, self.spec.remote, default_timeout_s, label, _LazyClient(self), headers)
        self.endpoints.append(endpoint)
        return endpoint

    def pool(self) -> SandboxPool:
        """The sandbox pool; made (and its isolation checked) when a reward needing it is built."""
        if self._pool is None:
            self._pool = SandboxPool(self.spec.sandbox)
        return self._pool

    def judge(self) -> ChatJudge:
        if self._judge is None:
            url = require_base_url(self.spec.judge) + "/chat/completions"
            key = judge_api_key(self.spec.judge)
            headers = {"Authorization": f"Bearer {key}"} if key else None
            self._judge = ChatJudge(self.endpoint(url, JUDGE_TIMEOUT_S, "LLM judge", headers), self.spec.judge)
        return self._judge

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


class _LazyClient:
    """Stands in for an httpx client until the first request, made inside the running loop."""

    def __init__(self, context: RewardContext):
        self.context = context

    def build_request(self, *args, **kwargs) -> httpx.Request:
        return self.context.client().build_request(*args, **kwargs)

    async def send(self, *args, **kwargs) -> httpx.Response:
        return await self.context.client().send(*args, **kwargs)


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
    """The reward function of ``spec``, built by its kind; a ``SpecError`` lists every problem it found."""
    context = RewardContext(spec)
    return ManagedReward(kind_of(spec.function).build(spec.function, spec, context), context)
