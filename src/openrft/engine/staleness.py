"""Staleness accounting for asynchronous rollouts: admission control, the drop rule, versions.

Pure bookkeeping (no threads, no clocks), after AReaL's staleness manager. The unit is a rollout
group (one prompt and its ``n`` completions); the learner consumes ``batch_size`` groups per step.

Admission. A generator may start a new group only while

    admitted_total < (age_tolerance + 1 + trained) * batch_size

where ``trained`` counts the batches the learner has finished and ``admitted_total`` counts every
group started and not dropped (consumed, ready, or still running). This is AReaL's
``(max_staleness + version + 1) * batch_size - (accepted + running)`` with the learner's step count
in place of its version (a step whose every reward failed takes no update but still consumes a
batch). Consumed in admission order, a group started after ``t`` batches is consumed within batch
``t + age_tolerance + 1``, so its policy age is at most ``age_tolerance``.

Drop rule. Groups finish out of order (replicas run at different speeds, a replica is replaced), so
a group can still be too old when the learner reaches it: its age
``learner_version - policy_version`` exceeds ``age_tolerance``. It is dropped, counted, and its
slot freed so that its prompt is generated again with a newer policy.

With ``age_tolerance = 0`` exactly one batch is admitted per learner step, after the update that
precedes it: the synchronous loop.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StalenessManager:
    batch_size: int
    age_tolerance: int
    version: int = 0  # the learner's policy version (updates applied)
    trained: int = 0  # batches the learner has finished with (one per step, updated or not)
    running: int = 0  # admitted, still being generated or scored
    ready: int = 0  # finished, waiting for the learner
    consumed: int = 0  # handed to the learner
    dropped: int = 0  # thrown away for staleness (total)
    ages: Counter = field(default_factory=Counter)  # policy age -> consumed groups

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.age_tolerance < 0:
            raise ValueError(f"age_tolerance must be >= 0, got {self.age_tolerance}")

    # admission ----------------------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        """Groups started and not dropped: consumed, ready or running."""
        return self.consumed + self.ready + self.running

    @property
    def limit(self) -> int:
        """The most groups that may have been admitted (and not dropped) by now."""
        return (self.age_tolerance + 1 + self.trained) * self.batch_size

    def capacity(self) -> int:
        return max(0, self.limit - self.admitted)

    def admit(self, wanted: int) -> int:
        """Admit up to ``wanted`` new groups; returns how many may start now (possibly 0)."""
        granted = min(max(wanted, 0), self.capacity())
        self.running += granted
        return granted

    def finish(self, count: int = 1) -> None:
        """``count`` running groups were generated and scored."""
        self._check(self.running >= count, f"finish({count}) with {self.running} running")
        self.running -= count
        self.ready += count

    def abandon(self, count: int = 1) -> None:
        """``count`` running groups will never finish (their work is re-issued as new admissions)."""
        self._check(self.running >= count, f"abandon({count}) with {self.running} running")
        self.running -= count

    # the drop rule ------------------------------------------------------------------------------

    def age(self, policy_version: int) -> int:
        return self.version - policy_version

    def is_stale(self, policy_version: int) -> bool:
        return self.age(policy_version) > self.age_tolerance

    def take(self, policy_version: int) -> bool:
        """The learner reaches a ready group: consume it (True) or drop it as too old (False)."""
        self._check(self.ready >= 1, "take() with no ready group")
        self.ready -= 1
        if self.is_stale(policy_version):
            self.dropped += 1
            return False
        self.consumed += 1
        self.ages[self.age(policy_version)] += 1
        return True

    # versions -----------------------------------------------------------------------------------

    def batch_trained(self, version: int) -> None:
        """The learner finished a batch; ``version`` is its policy version now (unchanged when the
        step took no update)."""
        self._check(version >= self.version, f"policy version went back from {self.version} to {version}")
        self.version = version
        self.trained += 1

    # checkpoints ---------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Work in flight is not saved: a resumed run issues its prompts again."""
        return {"version": self.version, "trained": self.trained, "consumed": self.consumed, "dropped": self.dropped}

    def load_state_dict(self, state: dict) -> None:
        self.version, self.trained = int(state["version"]), int(state["trained"])
        self.consumed, self.dropped = int(state["consumed"]), int(state["dropped"])
        self.running = self.ready = 0
        self.ages = Counter()

    @staticmethod
    def _check(condition: bool, message: str) -> None:
        if not condition:
            raise RuntimeError(f"staleness bookkeeping: {message}")
