"""The turns that agents ask for, sampled in batches on the thread that called ``generate``.

Each Sample of a trajectory submits its context; the generating thread samples them. With the local
generator (``continuous``) every turn joins one continuous decode batch at its next decode step, as the
built-in loop's independent schedule does (``rollout.continuous``): it leaves as soon as it ends, and a
trajectory's next turn continues the KV cache kept under its id when its context extends the turn's. Other
generators get whole ``generate`` calls: the waiting turns are sampled together as soon as every running
trajectory of the ``generate`` is waiting for one, or ``window_s`` after the first arrived (an agent busy
with its own tool does not hold the others back longer). Either way equal contexts (a prompt's trajectories
asking their first turn) are one prompt with ``n`` samples, one prefill, and the generator is only ever used
on that thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from openrft.rollout.types import Completion, SamplingParams


@dataclass
class _Turn:
    context: list[int]
    max_new_tokens: int
    future: Future
    key: str | None = None


class TurnBatcher:
    def __init__(self, inner: Any, params: SamplingParams, window_s: float):
        self.inner, self.params, self.window_s = inner, replace(params, n=1), window_s
        self._cond = threading.Condition()
        self._pending: list[_Turn] = []
        self._first_at: float | None = None
        self.running = 0  # trajectories of this generate with an agent call open
        self.to_start = 0  # trajectories of this generate not started yet (their first turn is still to come)
        self.cap = 1 << 30  # trajectories in flight at once (rollout.agent.max_concurrency)
        self.batches: list[int] = []  # the size of each batch sampled (for metrics and tests)

    def submit(self, context: list[int], max_new_tokens: int, key: str | None = None) -> Future:
        """A turn to sample (``key``: its trajectory, whose KV cache a continuous batch keeps between turns)."""
        future: Future = Future()
        with self._cond:
            self._pending.append(_Turn(context, max_new_tokens, future, key))
            if self._first_at is None:
                self._first_at = time.monotonic()
            self._cond.notify_all()
        return future

    def expect(self, trajectories: int, cap: int) -> None:
        """This many trajectories will start, at most ``cap`` at once: a batch waits for them too."""
        with self._cond:
            self.to_start, self.cap = trajectories, cap

    def started(self, first: bool = True) -> None:
        with self._cond:
            self.running += 1
            if first and self.to_start:
                self.to_start -= 1

    def ended(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run_until(self, finished: Callable[[], bool]) -> None:
        """Sample turns until ``finished()`` (checked whenever something changes)."""
        if getattr(self.inner, "continuous", False):
            self._run_continuous(finished)
            return
        while True:
            with self._cond:
                while True:
                    if self._pending:
                        waited = time.monotonic() - (self._first_at or 0.0)
                        expected = min(self.running + self.to_start, self.cap)
                        if len(self._pending) >= expected or waited >= self.window_s:
                            break
                        self._cond.wait(timeout=self.window_s - waited)
                        continue
                    if finished():
                        return
                    self._cond.wait(timeout=0.5)
                batch, self._pending, self._first_at = self._pending, [], None
            self._sample(batch)

    def _run_continuous(self, finished: Callable[[], bool]) -> None:
        submitted: list[_Turn] = []
        with self.inner.decoding(self.params) as session:
            while True:
                with self._cond:
                    while not self._pending and not session.busy:
                        if finished():
                            return
                        self._cond.wait(timeout=0.5)
                    batch, self._pending, self._first_at = self._pending, [], None
                if batch:
                    self.batches.append(len(batch))
                    submitted = [t for t in submitted if not t.future.done()] + batch
                for turns in _same_contexts(batch):
                    session.submit(
                        turns[0].context,
                        [t.max_new_tokens for t in turns],
                        [_answer(t.future) for t in turns],
                        [t.key for t in turns],
                    )
                if session.busy:
                    try:
                        session.step()
                    except BaseException as exc:
                        self._fail_waiting(exc, submitted)
                        raise

    def _fail_waiting(self, exc: BaseException, submitted: list[_Turn]) -> None:
        """The generator failed: every Sample still waiting answers with the error (the job sees it too)."""
        with self._cond:
            waiting, self._pending = [*submitted, *self._pending], []
        for turn in waiting:
            if not turn.future.done():
                turn.future.set_exception(exc)

    def _sample(self, batch: list[_Turn]) -> None:
        """One ``generate`` per count of equal contexts."""
        self.batches.append(len(batch))
        by_count: dict[int, list[list[_Turn]]] = {}
        for turns in _same_contexts(batch):
            by_count.setdefault(len(turns), []).append(turns)
        for count, groups in by_count.items():
            limit = max(t.max_new_tokens for turns in groups for t in turns)
            params = replace(self.params, n=count, max_new_tokens=limit)
            try:
                sampled: list[list[Completion]] = self.inner.generate([g[0].context for g in groups], params, None)
            except BaseException as exc:  # every waiting Sample answers with the error; the job sees it too
                for turn in batch:
                    if not turn.future.done():
                        turn.future.set_exception(exc)
                raise
            for turns, completions in zip(groups, sampled):
                for turn, completion in zip(turns, completions):
                    turn.future.set_result(completion)


def _same_contexts(batch: list[_Turn]) -> list[list[_Turn]]:
    """The turns grouped by equal context, in order of arrival."""
    same: dict[tuple[int, ...], list[_Turn]] = {}
    for turn in batch:
        same.setdefault(tuple(turn.context), []).append(turn)
    return list(same.values())


def _answer(future: Future) -> Callable[[Completion], bool]:
    """A decode row's callback: the turn's Sample gets its completion; the trajectory's KV cache is kept unless
    the turn was cut (then nothing of it can be continued)."""

    def done(completion: Completion) -> bool:
        future.set_result(completion)
        return completion.finish_reason == "stop"

    return done
