"""The API's futures: every call that computes returns ``{"request_id"}`` at once and runs on the worker
thread; ``retrieve_future`` waits a while for it and answers ``try_again`` until done. Concurrent samples from
one sampler run as one batch, which the ones still arriving join as it runs.

Fair among tenants (docs/tinker.md, "Fair among tenants"): each tenant (API key) has its own queue, in
arrival order (the order the SDK sends a client's calls in, so a ``forward_backward`` and the ``optim_step``
after it stay in order), and the one worker takes the head of each tenant's queue in turn (round robin).
Another tenant's call waits for at most the part of a call already running, not for a tenant's whole backlog:
a call whose work is a generator (``forward_backward``, in chunks of ``engine.CHUNK_TOKENS``) runs one part per
turn, other tenants' calls between its parts; every other call is bounded by the operator's
``--tinker-max-*`` options. ``schedule="fifo"`` serves every call whole in arrival order instead (the old order,
kept to measure against).

Stopped calls: a call is dropped before it runs, and a call in parts stops at its next part boundary (its
generator closed: ``engine.forward_backward_steps`` puts the gradients back as they were), when its client
cancels it (``cancel``: the API's ``cancel_future``) or is gone: nobody has asked for its future within
``abandon_s`` (the SDK polls each future from the moment it has its id), or its session sent no heartbeat for
``abandon_s`` (the SDK sends one every 10 s while its ServiceClient lives; ``beat``). A finished session's
queued calls are dropped too (``drop_session``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from openrft.disk_full import DISK_FULL_MESSAGE, is_disk_full

KEEP_RESULTS = 4096  # finished futures kept for (re)retrieval; the oldest are forgotten first
LINGER_S, LINGER_MAX_S = 0.01, 0.2  # how long a batch waits for requests still arriving
POLL_WAIT_S = 20.0  # a retrieve waits this long before try_again (the SDK's own timeout is 45 s)
ABANDON_S = 60.0  # a queued call nobody has retrieved for this long is dropped before it runs
SCHEDULES = ("fair", "fifo")

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
    session: str | None = None  # the SDK session its model or sampler belongs to
    seen: float = field(default_factory=time.monotonic)  # when it was submitted or last retrieved
    waiting: int = 0  # retrieves waiting on it now
    stop: str | None = None  # why it was cancelled while running: it stops at its next part boundary
    in_parts: bool = False  # running in parts (a generator): it can stop between two


@dataclass
class _Task:
    owner: str
    run: Callable[[], bool]  # one turn of it: True when it is done, False when it yielded and wants another
    pending: Pending | None  # None: work of the server's own (a sampler being loaded, a session freed)
    started: bool = False
    stop: Callable[[str], None] | None = None  # ends a call in parts between two parts, answering why


class _Host:
    """One worker thread and its tenants' queues: the calls of the clients on one host (this process, or one
    Ray actor of the server's cluster: remote.py), so that calls on different hosts run at the same time."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # "" (this process) or the node id of its Ray actor
        self.work = threading.Condition(threading.Lock())
        self.tenants: OrderedDict[str, deque[_Task]] = OrderedDict()  # the tenants with queued calls, in turn
        self.last: str | None = None  # the lane of the call run last
        self.thread: threading.Thread | None = None


class Futures:
    def __init__(self, schedule: str = "fair", abandon_s: float = ABANDON_S) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self.schedule, self.abandon_s = schedule, abandon_s
        self._items: OrderedDict[str, Pending] = OrderedDict()
        self._queues: dict[tuple, list[tuple[Any, Future, Pending]]] = {}  # batched requests by batch key
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}  # "" is this process
        self._closed = False
        self.ran: list[str] = []  # the owners of the last calls run, newest last (tests and the benchmark)
        self._beats: dict[str, float] = {}  # session -> when it last sent a heartbeat (or was created)
        # told (owner, host, seconds) after each turn a call ran: its tenant's quota (metering.py)
        self.on_ran: Callable[[str, str, float], None] | None = None
        self._host("")

    # queueing -------------------------------------------------------------------------------

    def _host(self, name: str) -> _Host:
        with self._lock:
            host = self._hosts.get(name)
            if host is None:
                host = self._hosts[name] = _Host(name)
                thread_name = "openrft-tinker" + (f"-{name}" if name else "")
                host.thread = threading.Thread(target=self._serve, args=(host,), name=thread_name, daemon=True)
                host.thread.start()
            return host

    def _enqueue(self, task: _Task, host_name: str = "") -> None:
        lane = task.owner if self.schedule == "fair" else ""
        host = self._host(host_name)
        with host.work:
            if self._closed:
                raise RuntimeError("the Tinker worker has stopped")
            host.tenants.setdefault(lane, deque()).append(task)
            host.work.notify()

    def _next(self, host: _Host) -> _Task | None:
        with host.work:
            while not host.tenants and not self._closed:
                host.work.wait()
            if self._closed:
                return None
            lane = next(iter(host.tenants))
            if lane == host.last and len(host.tenants) > 1:  # its queue emptied and refilled while it ran
                host.tenants.move_to_end(lane)
            lane, tasks = host.tenants.popitem(last=False)  # the tenant whose turn it is
            task = tasks.popleft()
            if tasks:
                host.tenants[lane] = tasks  # its next call waits for every other tenant's turn
            host.last = lane
            return task

    def _serve(self, host: _Host) -> None:
        while (task := self._next(host)) is not None:
            if not task.started and task.pending is not None and self._dropped(task.pending):
                continue
            if task.started and task.stop is not None and (why := self._stopped(task.pending)) is not None:
                task.stop(why)
                log.info("Tinker: stopped a call of %s between its parts: %s", task.owner, why)
                continue
            task.started = True
            if len(self.ran) >= 1000:
                del self.ran[:500]
            self.ran.append(task.owner)
            began = time.monotonic()
            try:
                done = task.run()
            except BaseException:  # run() answers its own future; nothing may stop the worker
                log.exception("the Tinker worker's task failed")
                done = True
            if self.on_ran is not None:
                try:
                    self.on_ran(task.owner, host.name, time.monotonic() - began)
                except Exception:
                    log.exception("Tinker: counting a call's time failed")
            if not done:  # its next part runs at its tenant's next turn, before the tenant's later calls
                lane = task.owner if self.schedule == "fair" else ""
                with host.work:
                    host.tenants.setdefault(lane, deque()).appendleft(task)
                    if self.schedule == "fair":
                        host.tenants.move_to_end(lane)

    def _gone(self, item: Pending) -> str | None:
        """Why ``item``'s client counts as gone (None: it is there)."""
        now = time.monotonic()
        if item.waiting == 0 and now - item.seen > self.abandon_s:
            return f"nobody retrieved this request for {self.abandon_s:g} s (a disconnected client)"
        beat = self._beats.get(item.session or "")
        if beat is not None and now - beat > self.abandon_s:
            return f"session {item.session} sent no heartbeat for {self.abandon_s:g} s (a disconnected client)"
        return None

    def _stopped(self, item: Pending) -> str | None:
        """Why a running call in parts stops before its next part (None: it goes on)."""
        return item.stop or self._gone(item)

    def _dropped(self, item: Pending) -> bool:
        """Whether a call about to run is dropped instead (answered so): cancelled, its session finished, or its
        client gone. One that is not is marked running (``drop_session`` and ``cancel`` leave it be)."""
        with self._lock:
            if item.future.done():  # cancelled, or dropped with its session
                return True
            why = self._gone(item)
            if why is None:
                item.future.set_running_or_notify_cancel()
                return False
            item.future.set_result(Failure(f"cancelled before it ran: {why}", "user"))
        log.info("Tinker: dropped a queued call of %s: %s", item.owner, why)
        return True

    def beat(self, session: str) -> None:
        """``session``'s client is there (a heartbeat, or the session just made)."""
        self._beats[session] = time.monotonic()

    def forget_session(self, session: str) -> None:
        self._beats.pop(session, None)

    def cancel(self, request_id: str, owner: str) -> str | None:
        """``cancel_future``: a queued call is dropped (answered ``cancelled``), a running call in parts stops at
        its next part boundary. Returns what happened ("dropped", "stopping", "finished", "running": a call
        not in parts, or a sample in its decode batch, runs to its end), None when ``owner`` has no such call."""
        item = self._items.get(request_id)
        if item is None or item.owner != owner:
            return None
        with self._lock:
            future = item.future
            if future.done():
                return "finished"
            if not future.running():
                future.set_result(Failure("cancelled before it ran: cancel_future", "user"))
                log.info("Tinker: dropped a queued call of %s: cancel_future", owner)
                return "dropped"
            item.stop = "cancelled by cancel_future"
            return "stopping" if item.in_parts else "running"

    def _remember(self, request_id: str, item: Pending) -> None:
        self._items[request_id] = item
        while len(self._items) > KEEP_RESULTS:
            oldest = next(iter(self._items))
            if not self._items[oldest].future.done():
                break
            self._items.popitem(last=False)

    def submit(
        self,
        owner: str,
        work: Callable[[], Any],
        user_errors: tuple[type[BaseException], ...],
        session: str | None = None,
        host: str = "",
    ) -> str:
        """``work`` on ``host``'s worker in ``owner``'s turn; a generator ``work`` returns runs a part a turn."""
        request_id = "req_" + uuid.uuid4().hex
        item = Pending(owner, Future(), session)
        steps = None  # a generator ``work`` returned: run a part of it per turn (a long call, in chunks)

        def run() -> bool:
            nonlocal steps
            try:
                if steps is None:
                    result = work()
                    if not inspect.isgenerator(result):
                        return answer(result)
                    steps = result
                next(steps)
                return False
            except StopIteration as done:
                return answer(done.value)
            except user_errors as exc:
                return answer(Failure(str(exc), "user"))
            except Exception as exc:  # the request fails, the server keeps serving
                return answer(Failure(internal_error(exc, "this request"), "server"))

        def answer(result: Any) -> bool:
            if not item.future.done():
                item.future.set_result(result)
            return True

        def stop(why: str) -> None:
            try:
                steps.close()  # GeneratorExit at its yield: its own cleanup runs (the gradients put back)
            except Exception as exc:
                log.error("Tinker: a stopped call's cleanup failed", exc_info=exc)
            answer(Failure(f"cancelled between its parts: {why}; nothing of it was kept", "user"))

        def run_in_parts() -> bool:
            done = run()
            if not done:
                item.in_parts = True
                task.stop = stop
            return done

        task = _Task(owner, run_in_parts, item)
        self._remember(request_id, item)
        self._enqueue(task, host)
        return request_id

    def call(self, owner: str, work: Callable[[], Any], host: str = "") -> Future:
        """``work`` on the worker in ``owner``'s turn (the server's own: never dropped); its future holds the
        result or the exception."""
        future: Future = Future()

        def run() -> bool:
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)
            return True

        self._enqueue(_Task(owner, run, None), host)
        return future

    def submit_batched(
        self,
        owner: str,
        key: tuple,
        payload: Any,
        run_batch: Callable[[list[Queued], Callable[[], list[Queued]]], None],
        user_errors: tuple[type[BaseException], ...],
        session: str | None = None,
        host: str = "",
    ) -> str:
        """A request that runs together with the others of the same ``key`` (concurrent samples from one
        sampler with the same parameters): those queued when its turn comes start together, and
        ``run_batch(first, more)`` may take the ones that arrive while it runs with ``more()`` (the sampler
        admits them into its running decode batch). It calls each one's ``deliver`` once; a request it took
        and did not deliver fails, and a request it did not take runs in the key's next batch."""
        request_id = "req_" + uuid.uuid4().hex
        item = Pending(owner, Future(), session)
        self._remember(request_id, item)
        with self._lock:
            self._queues.setdefault(key, []).append((payload, item.future, item))
        self._enqueue(_Task(owner, lambda: self._drain(key, run_batch, user_errors) or True, None), host)
        return request_id

    def _take(self, key: tuple, taken: list[Future]) -> list[Queued]:
        with self._lock:
            batch = self._queues.pop(key, [])
        batch = [(payload, future) for payload, future, item in batch if not self._dropped(item)]
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
            return  # an earlier drain of this key took them, or they were dropped
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

    def drop_session(self, session: str, why: str) -> int:
        """Answers every not-yet-run call of ``session`` with a failure saying ``why``: the worker then skips
        them. Returns how many were dropped."""
        dropped = 0
        with self._lock:
            for item in list(self._items.values()):
                future = item.future
                if item.session == session and not (future.done() or future.running()):
                    future.set_result(Failure(f"cancelled before it ran: {why}", "user"))
                    dropped += 1
        return dropped

    # retrieving -----------------------------------------------------------------------------

    def get(self, request_id: str, owner: str) -> Pending | None:
        item = self._items.get(request_id)
        if item is None or item.owner != owner:
            return None
        item.seen = time.monotonic()
        return item

    async def wait(self, item: Pending, timeout: float = POLL_WAIT_S) -> bool:
        if item.future.done():
            return True
        item.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(item.future)), timeout)
        except TimeoutError:
            return False
        finally:
            item.waiting -= 1
            item.seen = time.monotonic()
        return True

    def close(self) -> None:
        self._closed = True
        for host in list(self._hosts.values()):
            with host.work:
                host.work.notify_all()
