"""The cores benchmark's arithmetic (benchmarks/cores.py), against hand-computed values."""

import pytest

from benchmarks.cores import core_counts, figures


def _run(step: float, processes: int = 1, snapshot: float | None = None) -> dict:
    layout = {"generate": [processes, 1], "learn": [processes, 1]}
    return {"step_s": step, "processes": processes, "layout": layout, "snapshot_s": snapshot}


def test_speedup_per_added_core_and_against_the_machines_own():
    runs = {1: [_run(0.30), _run(0.28)], 2: [_run(0.20, 2, 0.001), _run(0.19, 2, 0.002), {"cores": 2, "error": "x"}]}
    one, two = figures(runs, {2: [1.9, 2.0]})
    assert one["step_s"] == 0.29 and one["speedup"] == 1.0 and one["per_added_core"] is None
    assert two["step_s"] == 0.195  # the failed run left out
    assert two["speedup"] == pytest.approx(0.29 / 0.195, abs=1e-3)  # 1.487
    assert two["per_added_core"] == pytest.approx(0.487, abs=1e-3) and two["efficiency"] == pytest.approx(
        0.744, abs=1e-3
    )
    assert two["machine_speedup"] == 1.95 and two["of_machine"] == pytest.approx(1.487 / 1.95, abs=1e-3)
    assert two["processes"] == [2, 2]
    assert one["snapshot_s"] is None and two["snapshot_s"] == 0.0015  # copies only on the processes' steps
    assert two["snapshot_share"] == pytest.approx(0.0015 / 0.195, abs=1e-4)


def test_core_counts_stop_at_the_machines():
    assert (
        core_counts(1) == [1] and core_counts(2) == [1, 2] and core_counts(3) == [1, 2] and core_counts(16) == [1, 2, 4]
    )
