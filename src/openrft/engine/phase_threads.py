"""Torch intra-op threads chosen per phase (generation, learning) by measuring the job's own steps.

One thread per core is right for the large matmuls of a real model and wrong for a small one, where
a second thread costs more in synchronisation than it saves (the demo model generates and learns
faster with one thread than with two on this project's 2-core machine; a 0.5B model the other way
round). Which wins depends on the model, the batch and the machine, so the engine measures instead of
guessing: each candidate count first runs the phase once unmeasured, as a warm-up, then runs it ``ROUNDS``
times, interleaved, and the count with the least time per unit of work (tokens) over all its runs is kept for
the rest of the job. The first warm-up, at the most threads, pays the allocator's and lazy initialisation's
costs; each count's own pays what is kept per thread count: on the demo model the learner's first run at 1
thread, after runs at 2, took 0.34-0.36 s against 0.27-0.30 s for its later ones, which made the time over
all runs favour 2 threads while only the most threads were warmed up. One run each picked the slower
count on a busy host (a neighbour's burst lands on one trial). The best run of each count was worse: on the
demo model with 2 cores it picked the slower count for generation in two seeds of three, because the count
whose runs vary more has the better best run (docs/performance.md). Time over all runs counts that spread
against the count. The choice is part of the job's checkpointed state, so a resumed job does not measure again. With
``runtime.threads`` set, or phases that overlap (asynchronous rollouts: threads are one setting for the whole
process), the engine does not tune.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

ROUNDS = 2
"""Runs of each candidate count before choosing, interleaved (2, 1, 2, 1)."""


def candidates(most: int) -> list[int]:
    """The thread counts worth trying: ``most``, then halving down to one (2 -> [2, 1]; 8 -> [8, 4, 2, 1])."""
    counts = [most]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


@dataclass
class _Phase:
    trials: list[int]  # the counts still to measure, in order
    warmups: list[int]  # the counts still to warm up (one unmeasured run each), before any trial
    seconds: dict[int, float] = field(default_factory=dict)  # each count's runs so far: their time
    work: dict[int, float] = field(default_factory=dict)  # and their work
    chosen: int | None = None


class Measure:
    """What the caller tells about one run of a phase: how much work it did (e.g. tokens)."""

    def __init__(self) -> None:
        self.work = 0.0


class PhaseThreads:
    """Per-phase thread counts, measured on the phases' first calls, then fixed."""

    def __init__(self, most: int, enabled: bool = True):
        self.most = most
        self.enabled = enabled and most > 1
        self.phases: dict[str, _Phase] = {}
        self.last: dict[str, int] = {}  # the count each phase last ran with

    def _phase(self, name: str) -> _Phase:
        if name not in self.phases:
            self.phases[name] = _Phase(trials=candidates(self.most) * ROUNDS, warmups=candidates(self.most))
        return self.phases[name]

    def threads_for(self, name: str) -> int:
        """The count the phase runs with next: its choice once made, else the next candidate to measure."""
        if not self.enabled:
            return self.most
        phase = self._phase(name)
        if phase.chosen is not None:
            return min(phase.chosen, self.most)  # a job resumed on a machine with fewer cores
        return phase.warmups[0] if phase.warmups else phase.trials[0]

    @contextlib.contextmanager
    def phase(self, name: str, measured: bool = True) -> Iterator[Measure]:
        """Run a block at the phase's thread count; a ``measured`` run with ``work`` set counts as a trial."""
        count = self.last[name] = self.threads_for(name)
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        measure = Measure()
        start = time.perf_counter()
        try:
            yield measure
        finally:
            seconds = time.perf_counter() - start
            torch.set_num_threads(before)
        if self.enabled and measured and measure.work > 0:
            self._record(self._phase(name), count, seconds, measure.work)

    @staticmethod
    def _record(phase: _Phase, count: int, seconds: float, work: float) -> None:
        if phase.chosen is not None:
            return
        if phase.warmups:
            phase.warmups.remove(count)
            return
        phase.seconds[count] = phase.seconds.get(count, 0.0) + seconds
        phase.work[count] = phase.work.get(count, 0.0) + work
        phase.trials.remove(count)
        if not phase.trials:
            phase.chosen = min(phase.seconds, key=lambda n: phase.seconds[n] / phase.work[n])

    def metrics(self) -> dict[str, float]:
        """The count each phase last ran with."""
        return {f"perf/threads_{name}": float(count) for name, count in self.last.items()}

    def state_dict(self) -> dict:
        phases = {
            name: {
                "chosen": p.chosen,
                "trials": p.trials,
                "seconds": p.seconds,
                "work": p.work,
                "warmups": p.warmups,
            }
            for name, p in self.phases.items()
        }
        return {"enabled": self.enabled, "phases": phases}

    def load_state_dict(self, state: dict) -> None:
        """The interrupted job's measurements and choices (a resumed job tunes only if the first run did)."""
        self.enabled = state["enabled"] and self.most > 1
        for name, saved in state["phases"].items():
            if "warmups" not in saved and saved["chosen"] is None:  # an older format's half-done trials: afresh
                continue
            self.phases[name] = _Phase(
                trials=list(saved["trials"]),
                seconds={int(k): v for k, v in saved.get("seconds", {}).items()},
                work={int(k): v for k, v in saved.get("work", {}).items()},
                warmups=list(saved.get("warmups", [])),
                chosen=saved["chosen"],
            )
