"""Every core of this machine without Ray: this process's learner and ``processes - 1`` learner processes
(``local_processes``), each holding the policy, for a synchronous job of the local engine on CPUs
(``placement.local_processes_wanted``). An agent's turns and tool episodes of the independent schedule are sampled
in this process (``phase_threads.episodes_sampled_here``); their learning steps take the layouts below like any other.

Each phase runs in one of two layouts, as the engine measured faster for it (``engine/phase_threads.py``, with
``runtime.threads`` unset): this process alone at a thread per core, or every process at once at
``cores // processes`` threads (``learner_group``): sampling a share of the prompts each from its own random
stream, learning a share of the samples each with the gradients summed before every update, so that every
process applies the update one learner on the whole batch would. On a model whose ops are too small to split
between threads (the demo model) the processes win both phases; on a 0.5B model threads may win one.

A process left out of a learning step (this process learned alone) gets this process's learner state (adapter,
reference, optimizer, scheduler) before it is next used. Checkpoints, evaluation (seeded, so its figures do not
depend on the layout) and the adapter sent anywhere are this process's. The processes are spawned when the
learner is built, in parallel with nothing else to wait for, and ended with the job.

A process that ends during a phase (killed, out of memory) does not end the job: the others are ended, the phase
runs again in this process alone at every thread, and so does every phase after it (the job's layouts are told,
``when_lost``). A learning step is run again from this process's state before it, kept for that (the adapter and
its optimizer state: small beside the model); with full-rank training that copy would be the whole model and its
optimizer, so there a lost process still fails the job, by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from openrft.engine.local_runtime import LearnerParts, LocalRuntime
from openrft.engine.phase_threads import episodes_sampled_here
from openrft.engine.setup import JobParts
from openrft.models import torch_threads
from openrft.rollout.types import SamplingParams, WrappedGenerator
from openrft.runtime.learner_group import GroupGenerator, GroupLearner, LearnerActor
from openrft.runtime.local_processes import LOCAL, ProcessActor, ProcessLost, ThreadActor
from openrft.runtime.ray_faults import PEER_LOSS_WAIT_S
from openrft.spec.job import JobSpec

MEMORY_SHARE = 0.5  # of the memory available at the start, what the extra processes' copies may take
COPY_FACTOR = 2.0  # a process's memory over its model's weights (activations, optimizer, the reference)


def processes_for(spec: JobSpec, cores: int, model: torch.nn.Module) -> tuple[int, str]:
    """How many learner processes (this one included) and why: ``runtime.processes``, else one per core the
    engine uses, as many as the model's copies fit in memory."""
    if spec.runtime.processes is not None:
        return spec.runtime.processes, f"runtime.processes {spec.runtime.processes}"
    if next(model.parameters()).device.type != "cpu":
        return 1, "the model is on a GPU"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    fit = 1 + int(psutil.virtual_memory().available * MEMORY_SHARE // max(1.0, COPY_FACTOR * weights))
    if fit < cores:
        return fit, f"{cores} cores, but {fit} copies of the {weights / 2**30:.2f} GiB model fit in memory"
    return cores, f"one per core the engine uses ({cores})"


class ProcessGroupLearner:
    """The job's learner: this process's (``rank0``) alone, or data-parallel with the other processes."""

    def __init__(
        self,
        rank0: LearnerActor,
        others: list[ProcessActor],
        cores: int | None = None,
        on_event: Callable[[str, str], None] | None = None,
    ):
        self.rank0, self.others = rank0, others
        self.here = ThreadActor(rank0)
        self.group = GroupLearner([self.here, *others], LOCAL)  # joins the processes' group (gloo, 127.0.0.1)
        self.processes = 1 + len(others)  # the layout of the phase that runs next (``use``)
        self.stale = False  # whether the others missed an update this process made alone
        self.cores = cores or torch.get_num_threads()  # this process's threads when it runs a phase alone
        self.on_event = on_event or (lambda level, message: None)
        self.when_lost: list[Callable[[], None]] = []  # told once the processes are lost (the job's layouts)

    @property
    def version(self) -> int:
        return self.rank0.learner.version

    @property
    def micro_batch_cap(self) -> int | None:
        return getattr(self.rank0.learner, "micro_batch_cap", None)

    @property
    def activation_bytes_per_token(self) -> float:
        return self.rank0.learner.activation_bytes_per_token

    def step(self, samples: list) -> dict[str, float]:
        if self.processes == 1 or not self.others:
            metrics = self.rank0.learner.step(samples)
            self.stale = True
            return metrics
        started = time.perf_counter()
        before = self.rank0.learner.snapshot() if self.rank0.policy.lora_enabled else None
        copied = time.perf_counter() - started
        try:
            self.bring_up_to_date()
            return self.group.step(samples) | {"perf/learner_snapshot_s": copied}
        except ProcessLost as lost:
            if before is None:  # full-rank: no copy of the state before the step to run it again from
                raise
            self.lose(lost, "learning step")
            self.rank0.learner.restore(before)
            with torch_threads(self.cores):
                return self.rank0.learner.step(samples)

    def lose(self, lost: ProcessLost, phase: str) -> None:
        """A process ended during ``phase``: once this process's own part of it has ended, end the others and go
        on alone (the job told), or fail with ``lost`` if that part does not end."""
        try:  # its thread runs calls in order: this one answers once the phase's call has ended
            self.here.version.remote().result(timeout=PEER_LOSS_WAIT_S)
        except Exception:
            raise lost from None
        self.release()
        self.on_event(
            "warn",
            f"{lost}: the other learner processes are ended and the {phase} runs again in this process, which runs "
            f"every phase alone from now on, at {self.cores} thread(s)",
        )
        for hook in self.when_lost:
            hook()

    def bring_up_to_date(self) -> None:
        """Give the other processes this process's learner state if they missed an update."""
        if self.stale:
            state = self.rank0.learner.state_dict()
            LOCAL.get([other.load_state_dict.remote(state) for other in self.others])
            self.stale = False

    def state_dict(self) -> dict:
        return self.rank0.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rank0.learner.load_state_dict(state)
        self.stale = True

    def release(self) -> None:
        """End the other processes: from now on every phase runs in this process alone."""
        for other in self.others:
            other.close()
        self.others, self.processes = [], 1
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def close(self) -> None:
        self.here.close()
        self.release()


class ProcessGroupGenerator(WrappedGenerator):
    """The job's generator: this process's own, or every process a share of the prompts. Seeded calls
    (evaluation) are always this process's, at every core's thread (the other processes are idle then)."""

    def __init__(self, local: Any, learner: ProcessGroupLearner, cores: int):
        self.inner, self.learner, self.cores = local, learner, cores
        self.group = GroupGenerator(learner.group.actors, LOCAL)
        self.processes = learner.processes

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        if seed is not None:
            with torch_threads(self.cores):
                return self.inner.generate(prompts, params, seed)
        if self.processes == 1 or not self.learner.others:
            return self.inner.generate(prompts, params, seed)
        try:
            self.learner.bring_up_to_date()
            return self.group.generate(prompts, params)
        except ProcessLost as lost:
            self.learner.lose(lost, "sampling")
            with torch_threads(self.cores):
                return self.inner.generate(prompts, params, seed)

    @property
    def continuous(self) -> bool:
        """Whether ``decoding`` runs (tool episodes and agents' turns sample through it, in this process)."""
        return getattr(self.inner, "continuous", False)

    def decoding(self, params: SamplingParams, seed: int | None = None):
        return self.inner.decoding(params, seed)

    def score(self, probe):
        return self.inner.score(probe)

    @property
    def probe_engine(self) -> tuple[str, str]:
        return self.inner.probe_engine


class LocalParallelRuntime(LocalRuntime):
    """``LocalRuntime`` with learner processes of this machine beside this one, where they fit."""

    def __init__(self, on_event=None):
        self.on_event = on_event or (lambda level, message: None)
        self._learner: ProcessGroupLearner | None = None

    def build_learner(self, spec: JobSpec, parts: JobParts) -> LearnerParts:
        cores = parts.threads
        processes, why = processes_for(spec, cores, parts.model)
        if processes <= 1:
            self.on_event("info", f"one learner process: {why}")
            return super().build_learner(spec, parts)
        each = max(1, cores // processes)
        others = self._start(spec, processes, each)
        local = super().build_learner(spec, parts, sharers=processes)
        rank0 = LearnerActor.around(self._policy, local.learner, local.generator)
        try:
            learner = ProcessGroupLearner(rank0, others, cores, self.on_event)
        except Exception as exc:  # a process that could not start: the job runs in this process, as it would have
            for other in others:
                other.close()
            if torch.distributed.is_initialized():  # joined before the others failed
                torch.distributed.destroy_process_group()
            self.on_event("warn", f"learner processes did not start ({exc}); the job runs in this process alone")
            return local
        self._learner = learner
        spec.runtime.processes = processes  # recorded in spec.json: a resumed run starts as many
        phases = "learning runs" if episodes_sampled_here(spec) else "each phase runs"
        self.on_event(
            "info",
            f"{processes} learner processes ({why}), {each} thread(s) each; {phases} on them or in this "
            f"process alone at {cores} thread(s), as measured faster",
        )
        generator = ProcessGroupGenerator(local.generator, learner, cores)

        def use(phase: str, count: int) -> None:
            """Before the phase's clock starts: the others brought up to date here, so that measuring a phase on
            the processes does not count the update a phase before it made alone."""
            if count > 1:
                learner.bring_up_to_date()
            if phase == "learn":
                learner.processes = count
            else:
                generator.processes = count

        return LearnerParts(
            learner,
            local.model,
            generator,
            local.adapter_state,
            local.probe_scores,
            processes=processes,
            use_processes=use,
            release_processes=learner.release,
            when_processes_lost=learner.when_lost.append,
        )

    @staticmethod
    def _start(spec: JobSpec, processes: int, each: int) -> list[ProcessActor]:
        own = spec.model_copy(deep=True)
        own.runtime.threads, own.runtime.processes = each, 1
        spec_json = own.model_dump_json()
        return [
            ProcessActor(LearnerActor, (spec_json, index, processes), f"learner-{index}")
            for index in range(1, processes)
        ]

    def close(self) -> None:
        if self._learner is not None:
            self._learner.close()
            self._learner = None
