"""CPU and subprocess work of requests (grader runs) off the API's event loop, in a bounded pool.

``graders/run`` and Vertex's reward validation start a sandbox and wait for user code: seconds each.
Run on the server's shared request threads, 40 of them were enough to stall every other route,
``/health`` included. They run here instead: ``workers`` at once, at most ``queue_limit`` more
waiting, and a request past that gets 429 with ``Retry-After`` rather than waiting without bound.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from openrft.service.errors import ApiError

T = TypeVar("T")


class WorkPool:
    def __init__(self, workers: int, queue_limit: int, name: str = "openrft-work"):
        self.workers = workers
        self.queue_limit = queue_limit
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._taken = 0  # running + waiting; only changed on the event loop's thread

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        if self._taken >= self.workers + self.queue_limit:
            raise ApiError(
                429,
                f"the server is running {self.workers} grader calls with {self.queue_limit} more waiting; "
                "retry in a few seconds",
                "rate_limit_exceeded",
                headers={"Retry-After": "5"},
            )
        self._taken += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(function, *args))
        finally:
            self._taken -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
