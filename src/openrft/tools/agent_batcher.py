"""The turns that agents ask for, sampled in batches on the thread that called ``generate``.

Each Sample of a trajectory submits its context; the generating thread collects them and samples them in
one call of its generator as soon as every running trajectory of the ``generate`` is waiting for a turn, or
``window_s`` after the first one arrived (an agent busy with its own tool does not hold the others back for
longer). The generator is only ever used on that thread, as the built-in tool loop uses it.
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


class TurnBatcher:
    def __init__(self, inner: Any, params: SamplingParams, window_s: float):
        self.inner, self.params, self.window_s = inner, replace(params, n=1), window_s
        self._cond = threading.Condition()
        self._pending: list[_Turn] = []
        self._first_at: float | None = None
        self.running = 0  # trajectories of this generate with an agent call open
        self.batches: list[int] = []  # the size of each batch sampled (for metrics and tests)

    def submit(self, context: list[int], max_new_tokens: int) -> Future:
        future: Future = Future()
        with self._cond:
            self._pending.append(_Turn(context, max_new_tokens, future))
            if self._first_at is None:
                self._first_at = time.monotonic()
            self._cond.notify_all()
        return future

    def started(self) -> None:
        with self._cond:
            self.running += 1

    def ended(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run_until(self, finished: Callable[[], bool]) -> None:
        """Sample batches of turns until ``finished()`` (checked whenever something changes)."""
        while True:
            with self._cond:
                while True:
                    if self._pending:
                        waited = time.monotonic() - (self._first_at or 0.0)
                        if len(self._pending) >= self.running or waited >= self.window_s:
                            break
                        self._cond.wait(timeout=self.window_s - waited)
                        continue
                    if finished():
                        return
                    self._cond.wait(timeout=0.5)
                batch, self._pending, self._first_at = self._pending, [], None
            self._sample(batch)

    def _sample(self, batch: list[_Turn]) -> None:
        params = replace(self.params, max_new_tokens=max(t.max_new_tokens for t in batch))
        self.batches.append(len(batch))
        try:
            groups: list[list[Completion]] = self.inner.generate([t.context for t in batch], params, None)
        except BaseException as exc:  # every waiting Sample answers with the error; the job sees it too
            for turn in batch:
                turn.future.set_exception(exc)
            raise
        for turn, (completion,) in zip(batch, groups):
            turn.future.set_result(completion)
