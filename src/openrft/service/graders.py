"""OpenAI ``graders/run`` and ``graders/validate``, and Vertex's reward validation call: the logic is the
rewards package's (the grader's kind builds and scores it, ``openrft.rewards.validation`` runs it once);
this module maps requests and errors, and runs grader calls off the API's event loop (``WorkPool``:
bounded, each tenant in its turn, stopped when the client hangs up).

The request's documents are bounded (depth, size) and the item's messages checked with the request body
(``service/schemas.py``), before anything here runs.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from openrft.calls.outbound import TENANT_CALLS, OutboundPolicy
from openrft.data.records import Example
from openrft.errors import OpenRFTError
from openrft.rewards.kinds.openai_graders import run_view
from openrft.rewards.kinds.vertex import validate_view
from openrft.rewards.types import Cancellable, ManagedReward, RewardOutcome, build_reward
from openrft.rewards.validation import example_from_line
from openrft.service.config import ServiceConfig
from openrft.service.errors import ApiError, from_spec_error
from openrft.service.tenancy import raise_problems, reward_problems
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import RewardSpec, reward_spec_from_document


def _checked_reward(
    document: dict[str, Any], prefix: str, tenant: ServiceConfig | None
) -> tuple[RewardSpec, ManagedReward]:
    """The reward spec of a grader or reward config and its reward, built (once), or a 400 naming the user's
    field paths. With ``tenant`` (the service's config), a tenant's request: operator settings are refused
    (403) before anything is built. The caller closes the reward."""
    try:
        spec = reward_spec_from_document(document)
    except SpecError as exc:
        raise from_spec_error(_prefixed(exc.problems, prefix), "invalid_grader") from None
    if tenant is not None:
        nested = isinstance(document, dict) and "function" in document
        raise_problems(
            reward_problems(spec, tenant, f"{prefix}.function" if nested else prefix, prefix), "invalid_grader"
        )
    try:
        return spec, build_reward(spec)
    except SpecError as exc:
        raise from_spec_error(_prefixed(exc.problems, prefix), "invalid_grader") from None


def _prefixed(problems: list[FieldProblem], prefix: str) -> SpecError:
    def path(p: str) -> str:
        p = p.removeprefix("grader").removeprefix("function.grader").lstrip(".")
        return f"{prefix}.{p}" if p and p != "<root>" else prefix

    return SpecError([FieldProblem(path(p.path), p.message, p.value) for p in problems])


def _item_example(item: Any, reference_answer: Any) -> Example:
    """The request's item (its messages already checked and normalised with the body) as a dataset line."""
    fields = dict(item) if isinstance(item, dict) else {}
    if reference_answer is not None:
        fields.setdefault("reference_answer", reference_answer)
    messages = fields.pop("messages", [])
    return Example(id=str(fields.get("id", "item")), messages=messages, fields=fields, tools=fields.pop("tools", None))


async def in_pool(request: Request, owner: str, function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a grader call of ``owner`` in the server's grader pool, in that tenant's turn (429 past its share),
    cancelled (its sandbox killed) if the client hangs up."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    pool = request.app.state.grader_pool
    return await pool.run(function, *args, tenant=owner, disconnected=disconnected, cancellable=True)


def _score(
    reward: ManagedReward,
    example: Example,
    response: str,
    cancellation: Cancellable | None,
    tenant: ServiceConfig | None,
) -> RewardOutcome:
    """One score; a tenant's endpoints (a Cloud Run scorer, a Nova Lambda's URL) are called here, in the server's
    process, at addresses the outbound policy checks when each connection is made (``openrft.calls.transport``)."""
    policy = OutboundPolicy() if tenant is not None and not tenant.allow_private_urls else None
    token = TENANT_CALLS.set(policy)  # the variable itself: ``outbound.applying`` would add a file to every walk
    try:
        return reward.score_one(example, response, cancellation=cancellation)
    except asyncio.CancelledError:
        raise ApiError(499, "the client closed the connection; the grader call was stopped", "client_closed") from None
    finally:
        TENANT_CALLS.reset(token)


def run(
    grader: dict[str, Any],
    model_sample: str,
    item: Any,
    reference_answer: Any,
    tenant: ServiceConfig | None,
    cancellation: Cancellable | None = None,
) -> dict[str, Any]:
    spec, reward = _checked_reward(grader, "grader", tenant)
    example = _item_example(item, reference_answer)
    outcome = _score(reward, example, model_sample, cancellation, tenant)
    _refuse_over_limit(outcome, "model_sample")
    return run_view(spec, outcome)


def _refuse_over_limit(outcome: RewardOutcome, param: str) -> None:
    """A grader input past a cap (rewards/input_limits.py) is the request's fault: 400 naming the cap."""
    if outcome.limit:
        raise ApiError(400, outcome.error_message or outcome.limit, "input_too_large", param)


def validate_grader(grader: dict[str, Any], tenant: ServiceConfig | None) -> dict[str, Any]:
    _spec, reward = _checked_reward(grader, "grader", tenant)
    asyncio.run(reward.aclose())
    return {"grader": grader}


def validate_vertex_reward(
    body: dict[str, Any], tenant: ServiceConfig | None, cancellation: Cancellable | None = None
) -> dict[str, Any]:
    key = "singleRewardConfig" if "singleRewardConfig" in body else "compositeRewardConfig"
    spec, reward = _checked_reward({key: body[key]}, key, tenant)
    try:
        example = example_from_line(body["example"], "example")
    except OpenRFTError as exc:
        asyncio.run(reward.aclose())
        raise ApiError(400, str(exc), "invalid_example", "example") from None
    parts = body["sampleResponse"].get("parts") or []
    response = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    outcome = _score(reward, example, response, cancellation, tenant)
    _refuse_over_limit(outcome, "sampleResponse")
    return validate_view(spec, outcome)


T = TypeVar("T")


class Cancellation:
    """Cancels a coroutine run by ``asyncio.run`` in another thread (a grader's sandbox call): the
    coroutine ``attach``es itself; ``cancel`` from any thread cancels it, now or as soon as it attaches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cancelled = False

    def attach(self) -> None:
        with self._lock:
            self._task, self._loop = asyncio.current_task(), asyncio.get_running_loop()
            if self.cancelled:
                self._task.cancel()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._task is not None and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._task.cancel)


class WorkPool:
    def __init__(
        self,
        workers: int,
        queue_limit: int,
        name: str = "openrft-work",
        tenant_workers: int | None = None,
        tenant_calls: int | None = None,
    ):
        self.workers = workers
        self.queue_limit = queue_limit
        self.tenant_workers = min(tenant_workers or workers, workers)
        self.tenant_calls = tenant_calls or workers + queue_limit
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        # only changed on the event loop's thread:
        self._taken: dict[str, int] = {}  # tenant -> calls running + waiting
        self._running: dict[str, int] = {}  # tenant -> calls running
        self._waiting: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()
        self._served: dict[str, int] = {}  # tenant -> when it last got a worker (a counter)
        self._turns = itertools.count()

    @property
    def taken(self) -> int:
        return sum(self._taken.values())

    def running(self, tenant: str | None = None) -> int:
        return sum(self._running.values()) if tenant is None else self._running.get(tenant, 0)

    async def run(
        self,
        function: Callable[..., T],
        *args: Any,
        tenant: str = "",
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        cancellable: bool = False,
    ) -> T:
        """``function(*args)`` on a worker thread, in ``tenant``'s turn. With ``disconnected`` (a coroutine
        function that returns when the client hangs up) the call is cancelled then: with ``cancellable``,
        ``function`` takes a ``Cancellation`` as its ``cancellation`` argument and stops when it is cancelled."""
        self._admit(tenant)
        self._taken[tenant] = self._taken.get(tenant, 0) + 1
        try:
            watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
            try:
                await self._wait_for_worker(tenant, watcher)
                try:
                    return await self._call(function, args, watcher, cancellable)
                finally:
                    self._running[tenant] -= 1
                    self._dispatch()
            finally:
                if watcher is not None:
                    watcher.cancel()
        finally:
            self._taken[tenant] -= 1
            if not self._taken[tenant]:
                del self._taken[tenant]

    def _admit(self, tenant: str) -> None:
        if self._taken.get(tenant, 0) >= self.tenant_calls:
            raise ApiError(
                429,
                f"this API key has {self.tenant_calls} grader calls running or waiting, the server's limit per "
                "API key; retry when one has answered",
                "rate_limit_exceeded",
                headers={"Retry-After": "5"},
            )
        if self.taken >= self.workers + self.queue_limit:
            raise ApiError(
                429,
                f"the server is running {self.workers} grader calls with {self.queue_limit} more waiting; "
                "retry in a few seconds",
                "rate_limit_exceeded",
                headers={"Retry-After": "5"},
            )

    def _may_start(self, tenant: str) -> bool:
        return self.running() < self.workers and self.running(tenant) < self.tenant_workers

    async def _wait_for_worker(self, tenant: str, watcher: asyncio.Future | None) -> None:
        if not self._waiting and self._may_start(tenant):
            self._start(tenant)
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(turn)
        self._dispatch()
        try:
            if watcher is None:
                await turn
            else:
                await asyncio.wait([turn, watcher], return_when=asyncio.FIRST_COMPLETED)
                if not turn.done():
                    raise ApiError(499, "the client closed the connection while its call waited", "client_closed")
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._running[tenant] -= 1  # it was given a worker it will not use
                self._dispatch()
            else:
                turn.cancel()
                self._forget(tenant, turn)
            raise

    def _start(self, tenant: str) -> None:
        self._running[tenant] = self._running.get(tenant, 0) + 1
        self._served[tenant] = next(self._turns)

    def _forget(self, tenant: str, turn: asyncio.Future) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[tenant]

    def _dispatch(self) -> None:
        """Hand free workers to waiting tenants: fewest calls running first, then the one served longest ago."""
        while self.running() < self.workers:
            ready = [t for t in self._waiting if self.running(t) < self.tenant_workers]
            if not ready:
                return
            tenant = min(ready, key=lambda t: (self.running(t), self._served.get(t, -1)))
            queue = self._waiting[tenant]
            turn = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            if turn.done():
                continue
            self._start(tenant)
            turn.set_result(None)

    async def _call(
        self, function: Callable[..., T], args: tuple, watcher: asyncio.Future | None, cancellable: bool
    ) -> T:
        loop = asyncio.get_running_loop()
        cancellation = Cancellation()
        call = (
            functools.partial(function, *args, cancellation=cancellation)
            if cancellable
            else functools.partial(function, *args)
        )
        future = loop.run_in_executor(self._executor, call)
        if watcher is None:
            return await future
        await asyncio.wait([future, watcher], return_when=asyncio.FIRST_COMPLETED)
        if not future.done():
            cancellation.cancel()  # the client hung up: stop the work, then give its worker back
            await asyncio.wait([future])
            if not future.cancelled():
                future.exception()  # retrieved: how the stopped call ended is of no use to anyone now
            raise ApiError(499, "the client closed the connection while its call ran", "client_closed")
        return future.result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
