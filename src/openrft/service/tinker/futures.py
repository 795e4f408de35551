"""The API's futures: every call that computes returns ``{"request_id"}`` at once and runs on one worker
thread, in arrival order; ``retrieve_future`` waits a while for it and answers ``try_again`` until done.
Concurrent samples from one sampler run as one batch, which the ones still arriving join as it runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from openrft.disk_full import DISK_FULL_MESSAGE, is_disk_full

KEEP_RESULTS = 4096  # finished futures kept for (re)retrieval; the oldest are forgotten first
LINGER_S, LINGER_MAX_S = 0.01, 0.2  # how long a batch waits for requests still arriving
POLL_WAIT_S = 20.0  # a retrieve waits this long before try_again (the SDK's own timeout is 45 s)

log = logging.getLogger("openrft.tinker")


@dataclass
class Failure:
    """What a failed request resolves to: the API's ``{"error", "category"}``."""

    message: str
    category: str  # "user" | "server"


def internal_error(exc: BaseException, what: str) -> str:
    """An unexpected error (a library's, the database's): logged for the operator with its traceback under a
    new error id; the client gets this stable message with the id, never the exception's text."""
    if is_disk_full(exc):  # the operator's to fix, and nothing half-written was kept (checkpoints.save)
        log.error("Tinker %s failed: %s", what, DISK_FULL_MESSAGE)
        return f"{DISK_FULL_MESSAGE}: the server could not complete {what} and kept nothing of it; try again later"
    error_id = "err_" + uuid.uuid4().hex[:16]
    log.error("Tinker %s failed (error id %s)", what, error_id, exc_info=exc)
    return f"internal error {error_id}: the server could not complete {what}; its operator's log has the details"


@dataclass
class Queued:
    """A batched request as its batch sees it: its payload, and the call that answers it."""

    payload: Any
    deliver: Callable[[Any], None]


def _deliver_once(future: Future) -> Callable[[Any], None]:
    def deliver(result: Any) -> None:
        if not future.done():
            future.set_result(result)

    return deliver


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
                return Failure(internal_error(exc, "this request"), "server")

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
        run_batch: Callable[[list[Queued], Callable[[], list[Queued]]], None],
        user_errors: tuple[type[BaseException], ...],
    ) -> str:
        """A request that runs together with the others of the same ``key`` (concurrent samples from one
        sampler with the same parameters): those queued when its turn comes start together, and
        ``run_batch(first, more)`` may take the ones that arrive while it runs with ``more()`` (the sampler
        admits them into its running decode batch). It calls each one's ``deliver`` once; a request it took
        and did not deliver fails, and a request it did not take runs in the key's next batch."""
        request_id = "req_" + uuid.uuid4().hex
        future: Future = Future()
        self._items[request_id] = Pending(owner, future)
        with self._lock:
            self._queues.setdefault(key, []).append((payload, future))
        self.executor.submit(self._drain, key, run_batch, user_errors)
        return request_id

    def _take(self, key: tuple, taken: list[Future]) -> list[Queued]:
        with self._lock:
            batch = self._queues.pop(key, [])
        taken += [future for _, future in batch]
        return [Queued(payload, _deliver_once(future)) for payload, future in batch]

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
        taken: list[Future] = []
        first = self._take(key, taken)
        if not first:
            return  # an earlier drain of this key took them
        failure = Failure("the batch ended without answering this request", "server")
        try:
            run_batch(first, lambda: self._take(key, taken))
        except user_errors as exc:
            failure = Failure(str(exc), "user")
        except Exception as exc:
            failure = Failure(internal_error(exc, "this sample request"), "server")
        for future in taken:
            if not future.done():
                future.set_result(failure)

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
