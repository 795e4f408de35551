"""Runs async reward functions from the synchronous training loop, on one long-lived event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample, checked

T = TypeVar("T")


class RewardRunner:
    """Owns an event loop thread so that HTTP clients and pools inside reward functions live across steps."""

    def __init__(self, function: RewardFunction):
        self.function = function
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openrft-rewards", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        return self.run(self._timed(samples)) if samples else []

    def submit(self, samples: list[RewardSample]) -> concurrent.futures.Future[list[RewardOutcome]]:
        """Start scoring and return at once: callers that overlap scoring with other work (the
        asynchronous rollout source) wait on, or add a callback to, the future."""
        return asyncio.run_coroutine_threadsafe(self._timed(samples), self._loop)

    async def _timed(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        start = time.perf_counter()
        outcomes = await self.function.score(samples)
        elapsed = time.perf_counter() - start
        if len(outcomes) != len(samples):
            raise RuntimeError(f"reward {self.function.name} returned {len(outcomes)} outcomes for {len(samples)}")
        for outcome in outcomes:
            if outcome.latency_s is None:
                outcome.latency_s = elapsed
        return [checked(o, f"reward {self.function.name}") for o in outcomes]

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self.function.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
