"""vs-trl's engine-threads mode: OpenRFT measures its thread counts per phase and keeps one for each, where a held
count does not tune."""

from benchmarks.vs_trl import matched_spec, run_openrft


def test_engine_threads_mode_chooses_per_phase_and_a_held_count_does_not(tmp_path):
    # a warm-up step at 2 and at 1 thread, then 2 and 1 twice each (engine/phase_threads.py), then the choice
    tuned = run_openrft(matched_spec(steps=7, seed=0, eval_every=7, threads=2), tmp_path, most_threads=2)
    assert set(tuned.chosen_threads) == {"generate", "learn"}
    assert {tuple(layout) for layout in tuned.chosen_threads.values()} <= {(1, 1), (1, 2)}
    held = run_openrft(matched_spec(steps=4, seed=0, eval_every=4, threads=2), tmp_path)
    assert held.chosen_threads == {} and held.threads == 2


def test_left_to_choose_openrft_measures_each_phase_on_its_learner_processes_and_alone(tmp_path):
    """The default comparison (issue 51): no thread or learner setting on OpenRFT's side, on 2 cores (pinned)."""
    from benchmarks.common import pinned_cores

    with pinned_cores(2) as cores:
        left = run_openrft(matched_spec(steps=7, seed=0, eval_every=7, threads=2), tmp_path, choose=True)
    assert set(left.chosen_threads) == {"generate", "learn"}
    if len(cores) == 2:  # this process alone at 2 threads, or the 2 processes at 1 thread each
        assert {tuple(layout) for layout in left.chosen_threads.values()} <= {(1, 2), (2, 1)}
