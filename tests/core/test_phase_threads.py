"""Threads per phase chosen by measuring (openrft.engine.phase_threads) and their place in the job loop."""

from __future__ import annotations

import json
import time

import pytest
import torch

from openrft.engine import RFTJob
from openrft.engine.phase_threads import PhaseThreads, candidates
from openrft.spec.dialects import load_job


def run(tuner: PhaseThreads, name: str, seconds_at: dict[int, float], work: float = 1.0) -> int:
    """One call of a phase whose duration depends on the thread count it runs with; returns that count."""
    with tuner.phase(name) as measure:
        count = torch.get_num_threads()
        time.sleep(seconds_at[count])
        measure.work = work
    return count


def test_candidates_halve_down_to_one():
    assert candidates(1) == [(1, 1)]
    assert candidates(2) == [(1, 2), (1, 1)]
    assert candidates(8) == [(1, 8), (1, 4), (1, 2), (1, 1)]
    assert candidates(6) == [(1, 6), (1, 3), (1, 1)]


def test_with_learner_processes_they_come_last_and_this_process_is_tried_only_above_their_threads():
    assert candidates(2, processes=2) == [(1, 2), (2, 1)]
    assert candidates(8, processes=4) == [(1, 8), (1, 4), (4, 2)]
    assert candidates(1, processes=2) == [(1, 1), (2, 1)]


def test_a_phase_that_runs_here_only_never_runs_on_the_processes():
    """Tool episodes: sampling stays in this process (its threads measured), learning also tries the processes."""
    told: list[tuple[str, int]] = []
    tuner = PhaseThreads(
        2, processes=2, on_layout=lambda phase, processes: told.append((phase, processes)), here_only={"generate"}
    )
    for _ in range(6):
        run(tuner, "generate", {2: 0.0, 1: 0.0})
        with tuner.phase("learn") as measure:
            measure.work = 1.0
    assert tuner._phase("generate").chosen in {(1, 2), (1, 1)}
    assert {p for phase, p in told if phase == "generate"} == {1} and ("learn", 2) in told
    off = PhaseThreads(2, enabled=False, processes=2, here_only={"generate"})  # threads set: nothing measured
    assert off.layout_for("generate") == (1, 2) and off.layout_for("learn") == (2, 2)


def test_once_the_processes_are_lost_every_phase_runs_in_this_process():
    """A phase that chose the processes runs here at every thread; one still measuring keeps only this process's
    layouts, and with none left to try keeps the fastest it measured here; a run on the processes that broke off
    counts for nothing."""
    told: list[tuple[str, int]] = []
    tuner = PhaseThreads(8, processes=4, on_layout=lambda phase, processes: told.append((phase, processes)))
    learn, generate = tuner._phase("learn"), tuner._phase("generate")
    learn.chosen = (4, 2)
    generate.warmups, generate.trials = [], [(4, 2), (1, 4), (4, 2)]  # (1, 8) measured twice, (1, 4) once
    generate.seconds, generate.work = {(1, 8): 2.0, (1, 4): 0.5, (4, 2): 0.1}, {(1, 8): 2.0, (1, 4): 1.0, (4, 2): 1.0}
    with tuner.phase("generate") as measure:  # on the processes when they are lost
        assert torch.get_num_threads() == 2
        tuner.lose_processes()
        measure.work = 1.0
    assert (tuner.processes, generate.trials, (4, 2) in generate.seconds) == (1, [(1, 4)], False)
    assert tuner.layout_for("learn") == (1, 8) and tuner.layout_for("generate") == (1, 4)
    run(tuner, "generate", {4: 0.0})  # the last trial: (1, 4) at 0.5 s per unit against (1, 8)'s 1.0
    assert generate.chosen == (1, 4) and tuner.layout_for("generate") == (1, 4)
    assert told[-1] == ("generate", 1) and "perf/processes_learn" not in tuner.metrics()

    measuring = PhaseThreads(2, processes=2)
    measuring._phase("learn").trials = [(2, 1)]
    measuring.lose_processes()  # nothing of this process's measured: every thread
    assert measuring.layout_for("learn") == (1, 2)


@pytest.mark.parametrize(("seconds_at", "best"), [({2: 0.06, 1: 0.01}, 1), ({2: 0.01, 1: 0.06}, 2)])
def test_the_faster_count_is_kept_after_a_warm_up_at_each_count_and_two_interleaved_trials_each(seconds_at, best):
    tuner = PhaseThreads(2)
    counts = [run(tuner, "learn", seconds_at) for _ in range(9)]
    assert counts[:2] == [2, 1]  # a warm-up at each count, the most threads first
    assert counts[2:6] == [2, 1, 2, 1]  # then each candidate twice, interleaved
    assert counts[6:] == [best] * 3
    assert tuner.metrics() == {"perf/threads_learn": float(best)}


def test_each_count_is_judged_by_its_time_over_all_its_runs_not_its_best():
    tuner = PhaseThreads(2)
    for _ in range(2):  # the warm-ups
        run(tuner, "learn", {2: 0.0, 1: 0.0})
    run(tuner, "learn", {2: 0.005, 1: 0.0})  # 2 threads: the best single run
    run(tuner, "learn", {2: 0.0, 1: 0.03})
    run(tuner, "learn", {2: 0.08, 1: 0.0})  # but spread: 85 ms in all
    run(tuner, "learn", {2: 0.0, 1: 0.03})  # 1 thread: 60 ms in all
    assert tuner.threads_for("learn") == 1


def test_each_counts_first_run_is_a_warm_up_not_a_measurement():
    # the first run at each count is slow (lazy initialisation, then what is kept per thread count); later
    # runs at 1 thread are faster than at 2: warming up only the first count would count 1's slow first run
    tuner = PhaseThreads(2)
    runs_at = {2: 0, 1: 0}
    for _ in range(6):
        count = tuner.threads_for("generate")
        first = runs_at[count] == 0
        runs_at[count] += 1
        run(tuner, "generate", {count: 0.3 if first else {2: 0.02, 1: 0.01}[count]})
    assert runs_at == {2: 3, 1: 3}
    assert tuner.threads_for("generate") == 1


def test_time_is_compared_per_unit_of_work():
    tuner = PhaseThreads(2)
    for _ in range(2):  # the warm-ups
        run(tuner, "generate", {2: 0.0, 1: 0.0})
    for _ in range(2):
        run(tuner, "generate", {2: 0.04, 1: 0.0}, work=10)  # 4 ms per token
        run(tuner, "generate", {2: 0.0, 1: 0.03}, work=3)  # 10 ms per token: slower, though it took less time
    assert tuner.threads_for("generate") == 2


def test_phases_are_tuned_apart_and_the_process_setting_is_restored():
    before = torch.get_num_threads()
    tuner = PhaseThreads(2)
    for _ in range(6):
        run(tuner, "generate", {2: 0.05, 1: 0.01})
        run(tuner, "learn", {2: 0.01, 1: 0.05})
    assert (tuner.threads_for("generate"), tuner.threads_for("learn")) == (1, 2)
    assert torch.get_num_threads() == before


def test_an_unmeasured_run_uses_the_choice_without_counting():
    tuner = PhaseThreads(2)
    for _ in range(5):
        with tuner.phase("generate", measured=False) as measure:
            measure.work = 1
    assert tuner.phases["generate"].warmups == [(1, 2), (1, 1)]


def test_disabled_or_single_core_never_changes_threads():
    for tuner in (PhaseThreads(2, enabled=False), PhaseThreads(1)):
        counts = [run(tuner, "learn", {2: 0.0, 1: 0.0}) for _ in range(4)]
        assert counts == [tuner.most] * 4
        assert tuner.phases == {} and tuner.metrics() == {"perf/threads_learn": float(tuner.most)}


def test_a_resumed_tuner_keeps_the_choice_and_the_trials_left():
    tuner = PhaseThreads(2)
    for _ in range(6):
        run(tuner, "learn", {2: 0.05, 1: 0.0})
    for _ in range(2):  # the warm-ups
        run(tuner, "generate", {2: 0.0, 1: 0.0})
    run(tuner, "generate", {2: 0.08, 1: 0.0})  # generation: its first trial at 2 done (slow), the others not yet
    state = json.loads(json.dumps(tuner.state_dict()))  # as a checkpoint stores it
    resumed = PhaseThreads(2, enabled=False)  # a resumed job's spec carries the threads the first run used
    resumed.load_state_dict(state)
    assert resumed.threads_for("learn") == 1
    assert resumed.threads_for("generate") == 1  # the trial still to run
    for _ in range(3):  # 1: 60 ms in all; 2: fast now, but 80 ms with its run before the resume
        run(resumed, "generate", {2: 0.0, 1: 0.03})
    assert resumed.threads_for("generate") == 1
    trials = state["phases"]["generate"]["trials"]
    older_phase = {"chosen": None, "trials": trials, "measured": {"2": 0.0}, "warmed_up": True}
    older = {"enabled": True, "phases": {"generate": older_phase}}
    from_older = PhaseThreads(2)
    from_older.load_state_dict(older)  # an older checkpoint's half-done trials: measured again from the warm-up
    assert "generate" not in from_older.phases and from_older.threads_for("generate") == 2
    fewer = PhaseThreads(1)
    fewer.load_state_dict(state)
    assert fewer.threads_for("learn") == 1 and not fewer.enabled


def test_the_job_records_its_thread_choices_and_resumes_with_them(tmp_path, recipe_factory, monkeypatch):
    import openrft.engine.setup as setup

    # as on an idle 2-core machine
    monkeypatch.setattr(setup, "configure_threads", lambda threads, measured=False: threads or 2)
    spec = load_job(recipe_factory(max_steps=8, save_steps=8))
    spec.runtime.threads = None  # the engine's choice (the small recipe pins one thread)
    seen: list[tuple[float, float]] = []

    def listener(step: int, metrics: dict) -> None:
        if step > 0:
            seen.append((metrics["perf/threads_generate"], metrics["perf/threads_learn"]))

    job = RFTJob(spec, tmp_path / "run", show_progress=False, listeners=(listener,))
    job.run()
    assert seen[:6] == [(2.0, 2.0), (1.0, 1.0)] * 3  # a warm-up at each count, then the trials
    chosen = (job.threads.threads_for("generate"), job.threads.threads_for("learn"))
    assert seen[6] == tuple(float(c) for c in chosen)
    state = job.threads.state_dict()
    assert all(p["chosen"] in ([1, 1], [1, 2]) for p in state["phases"].values())

    spec.training.total_steps = 9
    resumed = RFTJob(spec, tmp_path / "run", resume=True, show_progress=False)
    resumed.run()
    assert resumed.threads.state_dict() == state
