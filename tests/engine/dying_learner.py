"""A learner process that dies right after its first update of a data-parallel step (a process killed between
the collective and the end of the step: the job's own learner has applied that update by then)."""

from __future__ import annotations

import os

from openrft.runtime.learner_group import LearnerActor

EXIT_CODE = 3


class LearnerDyingAfterItsFirstUpdate(LearnerActor):
    def train(self, shares: list[list], tokens: list[int]):
        apply_update = self.learner.apply_update

        def apply_then_end() -> float:
            apply_update()
            os._exit(EXIT_CODE)

        self.learner.apply_update = apply_then_end
        return super().train(shares, tokens)
