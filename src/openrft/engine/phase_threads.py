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
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import torch

from openrft.spec.job import JobSpec

ROUNDS = 2
"""Runs of each candidate layout before choosing, interleaved (a, b, a, b)."""

Layout = tuple[int, int]
"""Where a phase runs: ``(processes, threads each)``; ``(1, n)`` is this process alone at ``n`` threads."""


def engine_measures(spec: JobSpec) -> bool:
    """Whether a job's layouts are measured per phase: ``runtime.threads`` unset, and generation and learning
    taking turns in the job's processes (synchronous rollouts from the local engine)."""
    return (
        spec.runtime.threads is None and spec.rollout.strategy == "sync" and spec.rollout.generation_engine == "local"
    )


def candidates(most: int, processes: int = 1) -> list[Layout]:
    """The layouts worth trying: this process at ``most`` threads, then halving down to one (2 -> (1, 2), (1, 1);
    8 -> ... (1, 1)). With ``processes`` learner processes, their layout comes last, each at ``most // processes``
    threads, and this process alone is tried only above that count (2 cores, 2 processes: (1, 2), (2, 1))."""
    each = max(1, most // processes) if processes > 1 else 0
    counts = [most]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    layouts = [(1, n) for n in counts if n > each] or [(1, most)]
    return [*layouts, (processes, each)] if processes > 1 else layouts


def describe(layout: Layout) -> str:
    processes, threads = layout
    place = "this process" if processes == 1 else f"{processes} processes"
    return f"{place} at {threads} thread{'s' if threads > 1 else ''}{' each' if processes > 1 else ''}"


@dataclass
class _Phase:
    trials: list[Layout]  # the layouts still to measure, in order
    warmups: list[Layout]  # the layouts still to warm up (one unmeasured run each), before any trial
    seconds: dict[Layout, float] = field(default_factory=dict)  # each layout's runs so far: their time
    work: dict[Layout, float] = field(default_factory=dict)  # and their work
    chosen: Layout | None = None


class Measure:
    """What the caller tells about one run of a phase: how much work it did (e.g. tokens)."""

    def __init__(self) -> None:
        self.work = 0.0


def episodes_sampled_here(spec: JobSpec) -> bool:
    """Whether a job's sampling stays in the job's process when learner processes are beside it: an agent's turns
    and tool episodes of the ``independent`` schedule decode in one continuous batch there (``rollout/continuous.py``,
    each episode's KV cache kept between its turns); ``lockstep`` tool turns are batches like any other, which the
    processes can share (the tools still run in the job's process, between turns)."""
    return spec.rollout.agent is not None or (spec.tools is not None and spec.tools.schedule != "lockstep")


class PhaseThreads:
    """Per-phase layouts (thread counts, and learner processes where the runtime has them), measured on the
    phases' first calls, then fixed. ``on_layout(phase, processes)`` tells the runtime how many of its processes
    the phase runs on next; ``on_choice(phase, chosen, seconds per unit of work of each layout)`` is called once
    a phase's layout is chosen."""

    def __init__(
        self,
        most: int,
        enabled: bool = True,
        processes: int = 1,
        on_layout: Callable[[str, int], None] | None = None,
        on_choice: Callable[[str, Layout, dict[Layout, float]], None] | None = None,
        here_only: Collection[str] = (),
    ):
        self.most, self.processes = most, processes
        self.here_only = here_only  # phases that run in this process whatever the processes (tool episodes)
        self.enabled = enabled and (most > 1 or processes > 1)
        self.on_layout, self.on_choice = on_layout, on_choice
        self.phases: dict[str, _Phase] = {}
        self.last: dict[str, Layout] = {}  # the layout each phase last ran with

    def _phase(self, name: str) -> _Phase:
        if name not in self.phases:
            layouts = candidates(self.most, self._processes(name))
            self.phases[name] = _Phase(trials=layouts * ROUNDS, warmups=list(layouts))
        return self.phases[name]

    def _processes(self, name: str) -> int:
        return 1 if name in self.here_only else self.processes

    def _fit(self, layout: Layout) -> Layout:
        """A chosen layout on this run's machine: a resumed job may have fewer cores, or no processes."""
        processes, threads = layout
        if processes > self.processes:
            return (1, self.most)
        return (processes, min(threads, self.most))

    def layout_for(self, name: str) -> Layout:
        """The layout the phase runs with next: its choice once made, else the next candidate to measure."""
        if not self.enabled:
            return (self._processes(name), self.most)
        phase = self._phase(name)
        if phase.chosen is not None:
            return self._fit(phase.chosen)
        return phase.warmups[0] if phase.warmups else phase.trials[0]

    def threads_for(self, name: str) -> int:
        return self.layout_for(name)[1]

    @contextlib.contextmanager
    def phase(self, name: str, measured: bool = True) -> Iterator[Measure]:
        """Run a block in the phase's layout; a ``measured`` run with ``work`` set counts as a trial."""
        layout = self.last[name] = self.layout_for(name)
        if self.on_layout is not None:
            self.on_layout(name, layout[0])
        before = torch.get_num_threads()
        torch.set_num_threads(layout[1])
        measure = Measure()
        start = time.perf_counter()
        try:
            yield measure
        finally:
            seconds = time.perf_counter() - start
            torch.set_num_threads(before)
        if self.enabled and measured and measure.work > 0:
            self._record(name, layout, seconds, measure.work)

    def _record(self, name: str, layout: Layout, seconds: float, work: float) -> None:
        phase = self._phase(name)
        if phase.chosen is not None or layout[0] > self.processes:  # chosen, or run on processes lost during it
            return
        if phase.warmups:
            phase.warmups.remove(layout)
            return
        phase.seconds[layout] = phase.seconds.get(layout, 0.0) + seconds
        phase.work[layout] = phase.work.get(layout, 0.0) + work
        phase.trials.remove(layout)
        if not phase.trials:
            rates = {n: phase.seconds[n] / phase.work[n] for n in phase.seconds}
            phase.chosen = min(rates, key=rates.__getitem__)
            if self.on_choice is not None:
                self.on_choice(name, phase.chosen, rates)

    def lose_processes(self) -> None:
        """The learner processes are gone: every phase runs in this process from now on. A phase still measuring
        keeps measuring this process's layouts; with none left to try, it keeps the fastest measured, else every
        thread. A choice of the processes stays in the state (a resumed run has them again); ``_fit`` maps it."""
        self.processes = 1
        self.enabled = self.enabled and self.most > 1
        for phase in self.phases.values():
            phase.warmups = [layout for layout in phase.warmups if layout[0] == 1]
            phase.trials = [layout for layout in phase.trials if layout[0] == 1]
            phase.seconds = {layout: s for layout, s in phase.seconds.items() if layout[0] == 1}
            phase.work = {layout: w for layout, w in phase.work.items() if layout[0] == 1}
            if phase.chosen is None and not phase.trials:
                phase.warmups = []
                rates = {layout: phase.seconds[layout] / phase.work[layout] for layout in phase.seconds}
                phase.chosen = min(rates, key=rates.__getitem__) if rates else (1, self.most)

    def settled_alone(self) -> bool:
        """Whether, with learner processes to choose, every phase has kept this process alone (they can go)."""
        phases = self.phases.values()
        return self.processes > 1 and bool(phases) and all(p.chosen is not None and p.chosen[0] == 1 for p in phases)

    def metrics(self) -> dict[str, float]:
        """The threads (and, with learner processes, the processes) each phase last ran with."""
        out = {f"perf/threads_{name}": float(layout[1]) for name, layout in self.last.items()}
        if self.processes > 1:
            out.update({f"perf/processes_{name}": float(layout[0]) for name, layout in self.last.items()})
        return out

    def state_dict(self) -> dict:
        phases = {
            name: {
                "chosen": list(p.chosen) if p.chosen else None,
                "trials": [list(n) for n in p.trials],
                "seconds": {_key(n): v for n, v in p.seconds.items()},
                "work": {_key(n): v for n, v in p.work.items()},
                "warmups": [list(n) for n in p.warmups],
            }
            for name, p in self.phases.items()
        }
        return {"enabled": self.enabled, "phases": phases}

    def load_state_dict(self, state: dict) -> None:
        """The interrupted job's measurements and choices (a resumed job tunes only if the first run did).
        Checkpoints from before learner processes hold thread counts: ``n`` is ``(1, n)``."""
        self.enabled = state["enabled"] and (self.most > 1 or self.processes > 1)
        for name, saved in state["phases"].items():
            if "warmups" not in saved and saved["chosen"] is None:  # an older format's half-done trials: afresh
                continue
            self.phases[name] = _Phase(
                trials=[_layout(n) for n in saved["trials"]],
                seconds={_layout(k): v for k, v in saved.get("seconds", {}).items()},
                work={_layout(k): v for k, v in saved.get("work", {}).items()},
                warmups=[_layout(n) for n in saved.get("warmups", [])],
                chosen=_layout(saved["chosen"]) if saved["chosen"] is not None else None,
            )


def _key(layout: Layout) -> str:
    return f"{layout[0]}x{layout[1]}"


def _layout(saved: int | str | list[int]) -> Layout:
    if isinstance(saved, list):
        return (int(saved[0]), int(saved[1]))
    text = str(saved)
    if "x" in text:
        processes, threads = text.split("x")
        return (int(processes), int(threads))
    return (1, int(text))
