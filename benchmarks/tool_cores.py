"""``python -m benchmarks tool-cores``: the tools example (examples/calculator/recipe.yaml) left to choose, which now
learns on learner processes of this machine where they are faster, and with the ``lockstep`` schedule also samples
on them (``independent`` episodes decode in the job's process: ``phase_threads.episodes_sampled_here``), against the
same job in one process (``runtime.processes: 1``, what a job with tools got before); both schedules, each run in a
fresh process, the runs alternating.

Per run, after the engine's measuring steps: the median step, its sampling and learning parts, and the learning
seconds per 1,000 trained tokens (the episodes change as the model learns to call its tool, and differ a little
between the two jobs, so learning is compared per token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks.common import ROOT, run_worker
from benchmarks.cores import layouts_kept, run_job

RECIPE = ROOT / "examples" / "calculator" / "recipe.yaml"
MEASURING_STEPS = 6  # learning: a warm-up and two trials in each layout
SETTINGS = ("left to choose", "one process")
SCHEDULES = ("lockstep", "independent")


def job_worker(steps: int, setting: str, schedule: str) -> dict:
    from openrft.spec.dialects import load_job

    spec = load_job(RECIPE)
    spec.training.total_steps = steps
    spec.evaluation.at_start, spec.evaluation.interval = False, 0
    spec.checkpoint.interval = 0
    spec.tracking.tensorboard = False
    spec.runtime.threads = None
    spec.runtime.processes = 1 if setting == "one process" else None
    spec.tools.schedule = schedule
    started = time.perf_counter()
    rows, events = run_job(spec)
    timed = [rows[s] for s in sorted(rows) if s > MEASURING_STEPS + 1]
    learn_s = sum(r["timing/training"] for r in timed)
    tokens = sum(r["actor/trained_tokens"] for r in timed)
    return {
        "setting": setting,
        "schedule": schedule,
        "step_s": round(statistics.median(r["perf/time_per_step"] for r in timed), 3),
        "sampling_s": round(statistics.median(r["timing/sampling_and_reward"] for r in timed), 3),
        "learning_s": round(statistics.median(r["timing/training"] for r in timed), 3),
        "learn_s_per_1k_tokens": round(1000 * learn_s / tokens, 4),
        "steps_timed": len(timed),
        "wall_s": round(time.perf_counter() - started, 1),
        "layout": layouts_kept(rows),
        "chosen": [m for m in events if "from now on" in m],
    }


def measure(steps: int, rounds: int, timeout: float, threads: int, log=print) -> dict:
    runs: dict[tuple[str, str], list[dict]] = {(c, s): [] for c in SCHEDULES for s in SETTINGS}
    for round_ in range(rounds):
        for schedule, setting in list(runs) if round_ % 2 == 0 else list(runs)[::-1]:
            command = [sys.executable, "-m", "benchmarks.tool_cores", "--worker", "--steps", str(steps)]
            identity = {"setting": setting, "schedule": schedule}
            row = run_worker([*command, "--setting", setting, "--schedule", schedule], threads, timeout, identity)
            runs[(schedule, setting)].append(row)
            log(f"  {schedule}, {setting}: {json.dumps(row)}")
    return {"rows": figures(runs), "runs": [r for done in runs.values() for r in done], "steps": steps}


def figures(runs: dict[tuple[str, str], list[dict]]) -> list[dict]:
    """Per schedule and setting, the medians over its runs; each against one process's of its schedule."""
    medians = {}
    for key, done in runs.items():
        good = [r for r in done if "step_s" in r]
        medians[key] = {
            name: statistics.median(r[name] for r in good)
            for name in ("step_s", "sampling_s", "learning_s", "learn_s_per_1k_tokens")
        }
    rows = []
    for (schedule, setting), m in medians.items():
        base = medians[(schedule, "one process")]
        rows.append(
            {
                "schedule": schedule,
                "setting": setting,
                **{name: round(value, 4) for name, value in m.items()},
                "learning_speedup": round(base["learn_s_per_1k_tokens"] / m["learn_s_per_1k_tokens"], 3),
                "sampling_speedup": round(base["sampling_s"] / m["sampling_s"], 3),
                "step_speedup": round(base["step_s"] / m["step_s"], 3),
                "layouts": [r["layout"] for r in runs[(schedule, setting)] if "layout" in r],
            }
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--setting", choices=SETTINGS, default=SETTINGS[0])
    parser.add_argument("--schedule", choices=SCHEDULES, default=SCHEDULES[0])
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(job_worker(args.steps, args.setting, args.schedule)), flush=True)
