"""The tool-cores benchmark's arithmetic (benchmarks/tool_cores.py), against hand-computed values."""

import pytest

from benchmarks.tool_cores import figures


def _run(setting: str, step: float, learning: float, per_1k: float, processes: int) -> dict:
    layout = {"generate": [1, 1], "learn": [processes, 1 if processes > 1 else 2]}
    return {
        "setting": setting,
        "step_s": step,
        "sampling_s": step - learning,
        "learning_s": learning,
        "learn_s_per_1k_tokens": per_1k,
        "layout": layout,
    }


def test_medians_over_runs_and_speedups_against_one_process():
    runs = {
        ("lockstep", "left to choose"): [
            _run("left to choose", 1.6, 0.6, 0.040, 2),
            _run("left to choose", 1.8, 0.7, 0.044, 2),
        ],
        ("lockstep", "one process"): [
            _run("one process", 2.0, 0.9, 0.060, 1),
            _run("one process", 2.2, 1.0, 0.056, 1),
            {"setting": "one process", "error": "timed out"},
        ],
    }
    chosen, alone = figures(runs)
    assert (chosen["setting"], alone["setting"], chosen["schedule"]) == ("left to choose", "one process", "lockstep")
    assert chosen["step_s"] == 1.7 and chosen["learning_s"] == 0.65 and chosen["learn_s_per_1k_tokens"] == 0.042
    assert alone["step_s"] == 2.1 and alone["learn_s_per_1k_tokens"] == 0.058  # the failed run left out
    assert chosen["learning_speedup"] == pytest.approx(0.058 / 0.042, abs=1e-3)  # 1.381
    assert chosen["step_speedup"] == pytest.approx(2.1 / 1.7, abs=1e-3)  # 1.235
    assert chosen["sampling_speedup"] == pytest.approx(1.15 / 1.05, abs=1e-3)  # sampling: step - learning, medians
    assert alone["learning_speedup"] == 1.0 and alone["step_speedup"] == 1.0
    assert [layout["learn"] for layout in chosen["layouts"]] == [[2, 1], [2, 1]]
