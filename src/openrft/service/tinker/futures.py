"""The API's futures: every call that computes returns ``{"request_id"}`` at once and runs on one worker
thread, in arrival order; ``retrieve_future`` waits a while for it and answers ``try_again`` until done."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

KEEP_RESULTS = 4096  # finished futures kept for (re)retrieval; the oldest are forgotten first
LINGER_S, LINGER_MAX_S = 0.01, 0.2  # how long a batch waits for requests still arriving
POLL_WAIT_S = 20.0  # a retrieve waits this long before try_again (the SDK's own timeout is 45 s)


@dataclass
class Failure:
    """What a failed request resolves to: the API's ``{"error", "category"}``."""

    message: str
    category: str  # "user" | "server"


@dataclass
class Pending:
    owner: str
    future: Future


class Futures:
    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openrft-tinker")
        self._items: OrderedDict[str, Pending] = OrderedDict()
        self._queues: dict[tuple, list[tuple[Any, Future]]] = {}
        self._lock = threading.Lock()

    def submit(self, owner: str, work: Callable[[], Any], user_errors: tuple[type[BaseException], ...]) -> str:
        request_id = "req_" + uuid.uuid4().hex

        def run() -> Any:
            try:
                return work()
            except user_errors as exc:
                return Failure(str(exc), "user")
            except Exception as exc:  # the request fails, the server keeps serving
                return Failure(f"{type(exc).__name__}: {exc}", "server")

        self._items[request_id] = Pending(owner, self.executor.submit(run))
        while len(self._items) > KEEP_RESULTS:
            oldest = next(iter(self._items))
            if not self._items[oldest].future.done():
                break
            self._items.popitem(last=False)
        return request_id

    def submit_batched(
        self,
        owner: str,
        key: tuple,
        payload: Any,
        run_batch: Callable[[list[Any]], list[Any]],
        user_errors: tuple[type[BaseException], ...],
    ) -> str:
        """A request that runs together with the others of the same ``key`` still queued when its turn
        comes (concurrent samples from one sampler: one generate call for all of them)."""
        request_id = "req_" + uuid.uuid4().hex
        future: Future = Future()
        self._items[request_id] = Pending(owner, future)
        with self._lock:
            self._queues.setdefault(key, []).append((payload, future))
        self.executor.submit(self._drain, key, run_batch, user_errors)
        return request_id

    def _drain(self, key: tuple, run_batch, user_errors) -> None:
        # the SDK sends a loop's samples one HTTP request each: wait while more keep coming, so the first
        # one does not run alone
        waited, queued = 0.0, -1
        while waited < LINGER_MAX_S:
            with self._lock:
                now = len(self._queues.get(key, []))
            if now == queued:
                break
            queued = now
            time.sleep(LINGER_S)
            waited += LINGER_S
        with self._lock:
            batch = self._queues.pop(key, [])
        if not batch:
            return  # an earlier drain of this key took them
        try:
            results = run_batch([payload for payload, _ in batch])
        except user_errors as exc:
            results = [Failure(str(exc), "user")] * len(batch)
        except Exception as exc:
            results = [Failure(f"{type(exc).__name__}: {exc}", "server")] * len(batch)
        for (_, future), result in zip(batch, results):
            future.set_result(result)

    def get(self, request_id: str, owner: str) -> Pending | None:
        item = self._items.get(request_id)
        return item if item is not None and item.owner == owner else None

    async def wait(self, item: Pending, timeout: float = POLL_WAIT_S) -> bool:
        if item.future.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(item.future)), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
