"""``python -m benchmarks cores``: the demo job on 1, 2 (and 4, where the machine has them) cores, OpenRFT left to
choose (``runtime.threads`` and ``runtime.processes`` unset), each run in a process pinned to that many cores
(``taskset``); the speed-up each added core brings. Side by side, the machine's own: as many single-thread matmul
processes at once as cores, against one alone, which is the most the cores can give (a virtual machine's cores
may share a physical one).

The job's figure is the median step after the engine's measurement steps (a warm-up and two trials of each
layout: ``engine/phase_threads.py``), evaluation and checkpoints off; the runs alternate between core counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, run_worker

MEASURING_STEPS = 6  # a warm-up and two trials in each of the two layouts (this process alone, the processes)


def core_counts(available: int) -> list[int]:
    return [n for n in (1, 2, 4) if n <= available]


def run_job(spec) -> tuple[dict[int, dict], list[str]]:
    """``spec`` run in a scratch folder on the runtime ``runtime_for`` places it on (learner processes where it
    may use them): each step's metrics, and the run's events."""
    from openrft.engine import RFTJob
    from openrft.runtime import runtime_for

    events: list[str] = []
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        RFTJob(
            spec,
            Path(workdir) / "run",
            runtime=runtime_for(spec, lambda level, message: events.append(message)),
            show_progress=False,
            listeners=(lambda step, metrics: rows.__setitem__(step, metrics),),
            on_event=lambda level, message: events.append(message),
        ).run()
    return rows, events


def layouts_kept(rows: dict[int, dict]) -> dict[str, list[int]]:
    """Each phase's layout in the last step, ``[processes, threads]``."""
    last = rows[max(rows)]
    return {
        phase: [int(last.get(f"perf/processes_{phase}", 1)), int(last[f"perf/threads_{phase}"])]
        for phase in ("generate", "learn")
    }


def job_worker(steps: int) -> dict:
    """The demo job in this (pinned) process, left to choose; its steps after the measuring ones."""
    from benchmarks.demo import demo_spec

    spec = demo_spec(None)  # threads unset: the engine's choice on the cores this process may use
    spec.training.total_steps = steps
    spec.evaluation.at_start, spec.evaluation.interval = False, 0
    spec.checkpoint.interval = 0
    started = time.perf_counter()
    rows, events = run_job(spec)
    timed = [rows[s] for s in sorted(rows) if s > MEASURING_STEPS + 1]
    kept = [row["perf/time_per_step"] for row in timed]
    copies = [row["perf/learner_snapshot_s"] for row in timed if "perf/learner_snapshot_s" in row]
    return {
        "cores": len(os.sched_getaffinity(0)),
        "step_s": round(statistics.median(kept), 4),
        "snapshot_s": round(statistics.median(copies), 5) if copies else None,
        "steps_timed": len(kept),
        "wall_s": round(time.perf_counter() - started, 1),
        "threads": int(spec.runtime.threads or 0),
        "processes": int(spec.runtime.processes or 1),
        "layout": layouts_kept(rows),
        "chosen": [m for m in events if "from now on" in m],
    }


def matmul_seconds(repeats: int = 300) -> float:
    """One thread's matmuls (the job's own kind of work), timed."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return time.perf_counter() - started


def machine_speedup(cores: int) -> float:
    """``cores`` single-thread matmul processes at once, one per core, against one alone: the work per second of
    all of them over one's."""

    def run(count: int) -> float:
        code = "from benchmarks.cores import matmul_seconds; print(matmul_seconds())"
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                ["taskset", "-c", str(i), sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE
            )
            for i in range(count)
        ]
        return max(float(p.communicate()[0]) for p in procs)

    alone = run(1)
    together = run(cores)
    return round(cores * alone / together, 3)


def measure(steps: int, rounds: int, timeout: float, log=print) -> dict:
    counts = core_counts(len(os.sched_getaffinity(0)))
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    ceiling: dict[int, list[float]] = {n: [] for n in counts if n > 1}
    for round_ in range(rounds):
        order = counts if round_ % 2 == 0 else counts[::-1]
        for n in order:
            cpus = ",".join(str(i) for i in sorted(os.sched_getaffinity(0))[:n])
            worker = [sys.executable, "-m", "benchmarks.cores", "--worker", "--steps", str(steps)]
            command = ["taskset", "-c", cpus, *worker]
            row = run_worker(command, n, timeout, {"cores": n})
            runs[n].append(row)
            log(f"  {n} core(s): {json.dumps(row)}")
            if n > 1:
                ceiling[n].append(machine_speedup(n))
                log(f"  {n} core(s): the machine's own speed-up {ceiling[n][-1]}")
    return {"rows": figures(runs, ceiling), "runs": runs, "steps": steps, "rounds": rounds}


def figures(runs: dict[int, list[dict]], ceiling: dict[int, list[float]]) -> list[dict]:
    """Per core count: the median step of its runs, the speed-up over 1 core's, per added core and per core, and
    against the machine's own speed-up at that count (its median)."""
    base = statistics.median(r["step_s"] for r in runs[1] if "step_s" in r)
    rows = []
    for n, done in runs.items():
        good = [r for r in done if "step_s" in r]
        step = statistics.median(r["step_s"] for r in good)
        speedup = base / step
        machine = statistics.median(ceiling[n]) if n > 1 else 1.0
        copies = [r["snapshot_s"] for r in good if r.get("snapshot_s") is not None]  # steps on the processes only
        rows.append(
            {
                "cores": n,
                "step_s": round(step, 4),
                "speedup": round(speedup, 3),
                "per_added_core": round((speedup - 1) / (n - 1), 3) if n > 1 else None,
                "efficiency": round(speedup / n, 3),
                "machine_speedup": machine,
                "of_machine": round(speedup / machine, 3) if n > 1 else None,
                "snapshot_s": round(statistics.median(copies), 5) if copies else None,
                "snapshot_share": round(statistics.median(copies) / step, 4) if copies else None,
                "layouts": [r["layout"] for r in good],
                "processes": [r["processes"] for r in good],
            }
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(job_worker(args.steps)), flush=True)
