"""CPU and subprocess work of requests (grader runs) off the API's event loop, in a bounded, fair pool.

``graders/run`` and Vertex's reward validation start a sandbox and wait for user code: seconds each.
Run on the server's shared request threads, 40 of them were enough to stall every other route,
``/health`` included. They run here instead: ``workers`` at once, at most ``queue_limit`` more
waiting, and a request past that gets 429 with ``Retry-After`` rather than waiting without bound.

Tenants share it fairly: one tenant's calls hold at most ``tenant_workers`` of the workers and
``tenant_calls`` places (running and waiting; past that, 429 naming the per-key limit), and a freed
worker goes to the waiting tenant with the fewest calls running, the one served least recently
first. A call whose client hangs up is cancelled: dropped from the queue, or its sandbox killed.
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

from openrft.service.errors import ApiError

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
