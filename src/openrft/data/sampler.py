"""Deterministic, resumable batches of prompts: a fresh seeded permutation every epoch."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0


class EpochSampler:
    """Yields ``batch_size`` indices per call, crossing epoch boundaries without repeats inside an epoch.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so a sampler restored from its
    state continues exactly where the original would have.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int):
        if size < 1:
            raise ValueError("a sampler needs at least one example")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.state = SamplerState()
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if self.state.position == self.size:
                self.state = SamplerState(self.state.epoch + 1, 0)
                self._order = self._permutation(self.state.epoch)
            take = min(self.batch_size - len(batch), self.size - self.state.position)
            batch += self._order[self.state.position : self.state.position + take]
            self.state.position += take
        return batch

    @property
    def epochs_done(self) -> float:
        return self.state.epoch + self.state.position / self.size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "position": self.state.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = SamplerState(int(state["epoch"]), int(state["position"]))
        self._order = self._permutation(self.state.epoch)
