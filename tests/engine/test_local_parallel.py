"""Every core without Ray (runtime/local_parallel.py, issue 51 point 1): learner processes of this machine beside
the job's own, each phase on them or in this process alone as measured, the same update as one learner on the
whole batch, a lost process named, and no second run of a user's unguarded script."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch

from openrft.engine import RFTJob
from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.learner.batch import TrainSample
from openrft.rollout.types import PolicyVersioned
from openrft.runtime import runtime_for
from openrft.runtime.learner_group import LearnerActor, load_model
from openrft.runtime.local_parallel import LocalParallelRuntime, ProcessGroupLearner
from openrft.runtime.local_processes import LOCAL, ProcessActor, ProcessLost
from openrft.spec.dialects import load_job


def _samples(seed: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    return [
        TrainSample(list(range(5 + p, 12 + p)), torch.randint(5, 60, (1 + (p + k) % 4,), generator=g).tolist(), k - 1.5)
        for p in range(4)
        for k in range(4)
    ]


def _local_learner(spec) -> tuple[Policy, Learner]:
    model, tokenizer, _ = load_model(spec)
    policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
    return policy, Learner(policy, learner_config(spec, tokenizer.pad_token_id))


def _adapter(policy: Policy) -> torch.Tensor:
    return torch.cat([t.flatten() for t in policy.adapter_state().values()])


def _pair_beside_one_learner(recipe_factory, other_class=LearnerActor):
    """One learner on the whole batch, and a group of this process's learner and one process of ``other_class``
    (the same initial adapter in all three); the group's events land in the returned list."""
    spec = load_job(recipe_factory(max_steps=3))
    spec.runtime.threads = 1
    whole_policy, whole = _local_learner(spec)
    policy, learner = _local_learner(spec)
    other = ProcessActor(other_class, (spec.model_dump_json(), 1, 2), "learner-1")
    events: list[str] = []
    rank0 = LearnerActor.around(policy, learner, PolicyVersioned())
    group = ProcessGroupLearner(rank0, [other], 1, lambda level, message: events.append(message))
    return (whole_policy, whole), (policy, learner), group, events


def test_two_processes_of_this_machine_make_one_learners_update_and_one_left_out_is_brought_up_to_date(
    recipe_factory,
):
    (whole_policy, whole), (policy, learner), group, _ = _pair_beside_one_learner(recipe_factory)
    other = group.others[0]
    try:
        for step, processes in enumerate([2, 1, 2]):  # the second step in this process alone: the other misses it
            group.processes = processes
            whole.load_state_dict(copy.deepcopy(learner.state_dict()))  # each step's update from the same state
            got = group.step(_samples(step))
            want = whole.step(_samples(step))
            assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-5, abs=1e-6)
            # float32 noise only (the shares are padded into other micro-batches): an update moves far more.
            # Compared step by step from the same state: over steps, Adam makes such noise grow (1e-4 by step 3)
            change = (_adapter(whole_policy) - _adapter(policy)).norm() / _adapter(whole_policy).norm()
            assert change < 1e-5, (step, processes)
            theirs = LOCAL.get(other.adapter_state.remote())
            if processes == 2:  # both applied the same summed gradient: the same bits
                assert all(torch.equal(theirs[name], value) for name, value in policy.adapter_state().items())
        assert group.version == whole.version == 3
    finally:
        group.close()
    assert other.process.poll() is not None


def test_a_learning_step_a_process_died_in_is_run_again_here_from_the_state_before_it(recipe_factory):
    """The other process is killed before a step on both: this process's share of the step breaks off in its
    collective; the step is run again here alone from the state before it, which gives one learner's update on the
    whole batch, and the processes are ended, the job's layouts told."""
    (whole_policy, whole), (policy, learner), group, events = _pair_beside_one_learner(recipe_factory)
    other = group.others[0]
    told = []
    group.when_lost.append(lambda: told.append(True))
    try:
        group.step(_samples(0))  # on both
        whole.load_state_dict(copy.deepcopy(learner.state_dict()))
        os.kill(other.pid, signal.SIGKILL)
        got, want = group.step(_samples(1)), whole.step(_samples(1))
        assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-6, abs=1e-7)
        assert torch.equal(_adapter(policy), _adapter(whole_policy))  # one learner's step, from the same state
        assert group.version == whole.version == 2
        assert (group.processes, group.others, told) == (1, [], [True])
        assert not torch.distributed.is_initialized()
        (event,) = events
        assert re.match(r"learner process learner-1 \(pid \d+\) ended during train\(\) with exit code -9", event), event
        assert "the learning step runs again in this process" in event
        group.step(_samples(2))  # alone from now on
        assert group.version == 3
    finally:
        group.close()


def test_a_step_whose_update_this_process_applied_before_the_other_died_is_run_again_from_before_it(recipe_factory):
    """The other process ends right after the step's update, which this process has applied too by then: the step
    is run again from the state before it, not on top of that update (one update, not two)."""
    from tests.engine.dying_learner import EXIT_CODE, LearnerDyingAfterItsFirstUpdate

    pair = _pair_beside_one_learner(recipe_factory, LearnerDyingAfterItsFirstUpdate)
    (whole_policy, whole), (policy, learner), group, events = pair
    try:
        whole.load_state_dict(copy.deepcopy(learner.state_dict()))
        group.step(_samples(0))
        whole.step(_samples(0))
        assert torch.equal(_adapter(policy), _adapter(whole_policy)) and group.version == whole.version == 1
        assert f"exit code {EXIT_CODE}" in events[0] and group.others == []
    finally:
        group.close()


def test_with_full_rank_training_a_process_lost_in_a_learning_step_fails_it_by_name(recipe_factory):
    """No copy of the whole model and its optimizer is kept to run the step again from."""
    spec = load_job(recipe_factory(max_steps=3))
    spec.runtime.threads, spec.lora.enabled = 1, False
    policy, learner = _local_learner(spec)
    other = ProcessActor(LearnerActor, (spec.model_dump_json(), 1, 2), "learner-1")
    group = ProcessGroupLearner(LearnerActor.around(policy, learner, PolicyVersioned()), [other], 1)
    try:
        os.kill(other.pid, signal.SIGKILL)
        with pytest.raises(ProcessLost, match=r"learner process learner-1 \(pid \d+\) ended"):
            group.step(_samples(0))
    finally:
        group.close()


def _job(spec, run_dir, runtime, listener, events: list[str]) -> RFTJob:
    """A job on ``runtime`` whose listener sees each step's metrics and whose events land in ``events``."""
    on_event = lambda level, message: events.append(message)  # noqa: E731
    return RFTJob(spec, run_dir, runtime=runtime, show_progress=False, listeners=(listener,), on_event=on_event)


def _parallel_spec(recipe_factory, steps: int):
    spec = load_job(recipe_factory(max_steps=steps, save_steps=steps))
    spec.runtime.threads = None  # the engine's choice: learner processes where the job can use them
    return spec


def test_with_threads_unset_a_job_measures_each_phase_on_the_processes_and_alone_and_says_what_it_chose(
    recipe_factory, tmp_path, monkeypatch
):
    import openrft.engine.setup as setup

    # as on an idle 2-core machine
    monkeypatch.setattr(setup, "configure_threads", lambda threads, measured=False: threads or 2)
    spec = _parallel_spec(recipe_factory, 7)
    events: list[str] = []
    runtime = runtime_for(spec, lambda level, message: events.append(message))
    assert isinstance(runtime, LocalParallelRuntime)
    seen, helper_cpu = [], []

    def listener(step: int, metrics: dict) -> None:
        if step > 0:
            seen.append((metrics["perf/processes_generate"], metrics["perf/processes_learn"]))
            times = psutil.Process(runtime._learner.others[0].pid).cpu_times()
            helper_cpu.append(times.user + times.system)

    job = _job(spec, tmp_path / "run", runtime, listener, events)
    assert job.run()["status"] == "succeeded"
    assert seen[:6] == [(1.0, 1.0), (2.0, 2.0)] * 3  # a warm-up in each layout, then two trials each, interleaved
    assert any(m.startswith("2 learner processes (one per core the engine uses (2))") for m in events)
    chosen = [m for m in events if "from now on, the fastest per 1,000 tokens" in m]
    assert [m.split(":")[0] for m in chosen] == ["generate", "learn"]
    assert all("2 processes at 1 thread each" in m and "this process at 2 threads" in m for m in chosen)
    # the other process computed in the steps that used it (steps 2 and 4: its CPU time grew), not in the others
    grew = [after - before for before, after in itertools.pairwise(helper_cpu)]  # in steps 2, 3, 4, 5
    # (CPU seconds, in clock ticks of 0.01 s: about 0.08 a step that uses it here, 0 one that does not)
    assert grew[0] >= 0.03 and grew[2] >= 0.03 and grew[1] <= 0.01 and grew[3] <= 0.01, grew
    assert runtime._learner is None and torch.distributed.is_initialized() is False
    recorded = json.loads((tmp_path / "run" / "spec.json").read_text())["runtime"]
    assert recorded["processes"] == 2 and recorded["threads"] == 2
    state = job.threads.state_dict()

    spec.training.total_steps = 8  # resumed from the recorded spec: as many processes again, the choices kept
    resumed_runtime = runtime_for(spec)
    assert isinstance(resumed_runtime, LocalParallelRuntime)
    resumed = RFTJob(spec, tmp_path / "run", resume=True, runtime=resumed_runtime, show_progress=False)
    assert resumed.run()["status"] == "succeeded"
    assert resumed.threads.state_dict() == state


def test_a_learner_process_that_dies_leaves_the_job_in_this_process_named_with_its_exit_code(recipe_factory, tmp_path):
    """Killed between steps: the next phase (sampling) finds it gone, runs again here, and so does every phase after;
    the job ends as it would have."""
    spec = _parallel_spec(recipe_factory, 4)
    spec.runtime.threads, spec.runtime.processes = 1, 2  # both fixed: every phase on the two processes
    events: list[str] = []
    runtime = runtime_for(spec, lambda level, message: events.append(message))
    rows: dict[int, dict] = {}

    def kill(step: int, metrics: dict) -> None:
        rows[step] = metrics
        if step == 1:
            os.kill(runtime._learner.others[0].pid, signal.SIGKILL)

    job = _job(spec, tmp_path / "run", runtime, kill, events)
    assert job.run()["status"] == "succeeded"
    (lost,) = [e for e in events if "ended during" in e]
    assert re.match(r"learner process learner-1 \(pid \d+\) ended during generate\(\) with exit code -9", lost)
    assert "the sampling runs again in this process" in lost
    assert rows[1]["perf/processes_generate"] == rows[1]["perf/processes_learn"] == 2.0
    assert 0 < rows[1]["perf/learner_snapshot_s"] < 0.05  # the copy a learning step on the processes keeps
    assert all("perf/learner_snapshot_s" not in rows[step] for step in (2, 3, 4))
    assert all("perf/processes_generate" not in rows[step] for step in (2, 3, 4)), rows
    assert job.learner.others == [] and job.learner.version == 4


def test_a_users_script_without_a_main_guard_runs_once(tmp_path):
    """Not ``multiprocessing``'s spawn, which imports the caller's ``__main__`` again in the child."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            from openrft.runtime.local_processes import LOCAL, ProcessActor
            print("script ran", flush=True)
            actor = ProcessActor(dict, ({"a": 1},), "probe")
            print("got", LOCAL.get(actor.get.remote("a")), flush=True)
            try:
                LOCAL.get(actor.pop.remote("missing"))
            except KeyError as exc:
                print("error came back:", repr(exc), flush=True)
            actor.close()
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.count("script ran") == 1, out.stdout + out.stderr
    assert "got 1" in out.stdout and "error came back: KeyError('missing')" in out.stdout


def test_when_every_phase_keeps_the_jobs_process_alone_the_learner_processes_end(recipe_factory, tmp_path, monkeypatch):
    """Planted: each phase 0.2 s slower on the processes, so the measurement keeps this process alone for both; the
    other process is then ended (a 0.5B model's copy is gigabytes), and the job goes on without it."""
    import time

    import openrft.engine.setup as setup
    from openrft.runtime.local_parallel import ProcessGroupGenerator

    monkeypatch.setattr(setup, "configure_threads", lambda threads, measured=False: threads or 2)
    for cls, name in ((ProcessGroupLearner, "step"), (ProcessGroupGenerator, "generate")):
        original = getattr(cls, name)

        def slower(self, *args, _original=original, **kwargs):
            if self.processes > 1:
                time.sleep(0.2)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, slower)
    spec = _parallel_spec(recipe_factory, 8)
    events: list[str] = []
    runtime = runtime_for(spec)
    alive: list[tuple[bool, bool]] = []  # per step: whether the job still holds a learner process, and it still runs
    first: list[ProcessActor] = []

    def listener(step: int, metrics: dict) -> None:
        if step > 0:
            first[:] = first or list(runtime._learner.others)
            alive.append((bool(runtime._learner.others), first[0].process.poll() is None))

    job = _job(spec, tmp_path / "run", runtime, listener, events)
    assert job.run()["status"] == "succeeded"
    # ended in step 6, once both phases had chosen (a warm-up and two trials in each layout)
    assert alive == [(True, True)] * 5 + [(False, False)] * 3
    assert any("its learner processes ended, memory freed" in m for m in events)
