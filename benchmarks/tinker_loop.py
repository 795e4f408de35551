"""``make demo``'s job and the Tinker example's RL loop, the same number of steps, in one invocation.

The demo job runs as ``openrft train examples/arithmetic/recipe.yaml --steps N`` (its
``perf/time_per_step``: rollout, reward, advantages, learner step). The example runs
``examples/tinker_rl/train.py --steps N`` with the official SDK against an ``openrft serve --workers 0``
started here on a free loopback port (its ``step_seconds``: publishing the weights to a sampler,
sampling, reward, advantages, ``forward_backward``, ``optim_step``). Validation is left out of both.
Rounds alternate which of the two goes first, so a change in the machine's load hits both; the load average is
sampled every few seconds during each run, and the ratio is taken within each round (its median over rounds).
Each system's CPU seconds per step (the demo's process; the example's client and server processes) are read as
each step's row reaches its metrics file: a figure the machine's load moves far less than wall time. The server's
own timings per step (time/* in the session's rows on the dashboard) say where the example's step went.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from benchmarks.common import ROOT, load_average

RECIPE = ROOT / "examples" / "arithmetic" / "recipe.yaml"
EXAMPLE = ROOT / "examples" / "tinker_rl" / "train.py"


def _env(tree: Path = ROOT) -> dict[str, str]:
    path = os.pathsep.join([str(tree / "src"), str(tree), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TINKER_TELEMETRY": "0"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds while a run lasts (its mean and range go with it)."""

    def __init__(self, every_s: float = 5.0):
        self.every_s, self.samples = every_s, [load_average()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(load_average()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(load_average()[0])

    def summary(self) -> dict:
        x = self.samples
        return {"mean": round(statistics.fmean(x), 2), "min": min(x), "max": max(x), "samples": len(x)}


class StepCPU:
    """CPU seconds per step of a system's processes (and their children), read each time a step's row reaches its
    metrics file (polled every ``every_s``). An interval that held a validation, or more than one step (a late
    poll), is left out."""

    def __init__(
        self,
        path: Path,
        processes: list[psutil.Process],
        is_step: Callable[[dict], bool],
        is_eval: Callable[[dict], bool],
        every_s: float = 0.02,
    ):
        self.path, self.processes, self.is_step, self.is_eval, self.every_s = path, processes, is_step, is_eval, every_s
        self.per_step: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StepCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _cpu(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                for p in [process, *process.children(recursive=True)]:
                    times = p.cpu_times()
                    total += times.user + times.system
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        offset, last, dirty = 0, None, True  # the first interval holds the start-up: no step
        while not self._stop.wait(self.every_s):
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                continue
            if size <= offset:
                continue
            with self.path.open("rb") as f:
                f.seek(offset)
                chunk = f.read(size - offset)
            end = chunk.rfind(b"\n") + 1
            if not end:
                continue
            cpu = self._cpu()
            offset += end
            rows = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
            steps = [r for r in rows if self.is_step(r)]
            dirty = dirty or any(self.is_eval(r) for r in rows) or len(steps) > 1
            if steps:
                if last is not None and not dirty:
                    self.per_step.append(cpu - last)
                last, dirty = cpu, self.is_eval(steps[-1])

    def summary(self) -> dict:
        x = self.per_step
        return {"median_step_cpu_s": statistics.median(x) if x else None, "cpu_steps": len(x)}


def _summary(system: str, times: list[float], curve: dict[int, float], wall: float, load: dict, cpu: dict) -> dict:
    return {
        "system": system,
        "steps": len(times),
        "mean_step_s": statistics.fmean(times),
        "median_step_s": statistics.median(times),
        **cpu,
        "curve": curve,
        "final_val_reward": curve[max(curve)] if curve else None,
        "wall_s": wall,
        "load": load,
    }


def run_demo(steps: int, workdir: Path) -> dict:
    out = workdir / "demo"
    load = {"before": load_average()}
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "openrft", "train", str(RECIPE), "--output", str(out), "--overwrite"]
    process = subprocess.Popen([*cmd, "--steps", str(steps), "--quiet"], env=_env(), cwd=ROOT)
    is_eval = lambda r: any(k.startswith("val-score/") for k in r)  # noqa: E731
    watch = StepCPU(out / "metrics.jsonl", [psutil.Process(process.pid)], lambda r: "perf/time_per_step" in r, is_eval)
    with LoadSampler() as sampler, watch:
        if process.wait() != 0:
            raise RuntimeError(f"openrft train exited with {process.returncode}")
    wall = time.perf_counter() - started
    load.update(after=load_average(), during=sampler.summary())
    rows = _rows(out / "metrics.jsonl")
    times = [r["perf/time_per_step"] for r in rows if "perf/time_per_step" in r]
    curve = {int(r["step"]): r["val-score/rewards/mean@1"] for r in rows if "val-score/rewards/mean@1" in r}
    return _summary("make demo (openrft train)", times, curve, wall, load, watch.summary())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_example(steps: int, workdir: Path, eval_every: int, tree: Path = ROOT) -> dict:
    """The example and ``openrft serve`` of the checkout at ``tree`` (this one unless a baseline is measured)."""
    port, data = _free_port(), workdir / "serve"
    env = {**_env(tree), "OPENRFT_HOME": str(data)}
    cmd = [sys.executable, "-m", "openrft", "serve", "--workers", "0", "--port", str(port), "--data-dir", str(data)]
    server = subprocess.Popen([*cmd, "--log-level", "warning"], env=env, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(base + "/api/v1/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"openrft serve did not come up on {base}")
            time.sleep(0.5)
        metrics = workdir / "tinker" / "metrics.jsonl"
        load = {"before": load_average()}
        started = time.perf_counter()
        args = ["--steps", str(steps), "--eval-every", str(eval_every), "--out", str(metrics)]
        client_env = {**env, "TINKER_BASE_URL": base, "TINKER_API_KEY": "tml-local"}
        example = tree / EXAMPLE.relative_to(ROOT)
        client = subprocess.Popen([sys.executable, str(example), *args], env=client_env, cwd=tree)
        processes = [psutil.Process(client.pid), psutil.Process(server.pid)]
        watch = StepCPU(metrics, processes, lambda r: "step_seconds" in r, lambda r: "val_reward" in r)
        with LoadSampler() as sampler, watch:
            if client.wait() != 0:
                raise RuntimeError(f"{example} exited with {client.returncode}")
        wall = time.perf_counter() - started
        load.update(after=load_average(), during=sampler.summary())
        server_timings = _server_timings(base)
    finally:
        server.terminate()
        server.wait(timeout=60)
    rows = _rows(metrics)
    times = [r["step_seconds"] for r in rows if "step_seconds" in r]
    curve = {int(r["step"]): r["val_reward"] for r in rows if "val_reward" in r}
    cpu = {**watch.summary(), "server": server_timings}
    return _summary("Tinker example (SDK -> openrft serve)", times, curve, wall, load, cpu)


def _server_timings(base: str) -> dict[str, float]:
    """The medians over steps of the server's own timings (``time/*`` in the session's rows, on the dashboard;
    none from a server that predates them)."""
    jobs = httpx.get(base + "/v1/dashboard/jobs", timeout=30).json()["data"]
    if not jobs:
        return {}
    page = httpx.get(f"{base}/v1/dashboard/jobs/{jobs[0]['id']}", timeout=30).json()
    lines = {line["name"]: line["values"] for chart in page["charts"] for line in chart["lines"]}
    # the first step's samples hold step 0's validation too (the same sampler): left out with it
    return {name: statistics.median(v[1:]) for name, v in sorted(lines.items()) if name.startswith("time/") and v[1:]}


def side_by_side(steps: int, rounds: int, eval_every: int, log: Callable[[str], None]) -> dict:
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="openrft-bench-tinker-") as tmp:
        for round_ in range(rounds):
            order = ("demo", "example") if round_ % 2 == 0 else ("example", "demo")
            pair = {}
            for which in order:
                workdir = Path(tmp) / f"round{round_}"
                log(f"  round {round_ + 1}: {which}, {steps} steps")
                r = run_demo(steps, workdir) if which == "demo" else run_example(steps, workdir, eval_every)
                r["round"] = round_ + 1
                log(f"    mean {r['mean_step_s']:.3f} s/step, validation {r['final_val_reward']}")
                pair[which] = r
                runs.append(r)
            example, demo = pair["example"], pair["demo"]
            example["ratio_mean"] = example["mean_step_s"] / demo["mean_step_s"]
            example["ratio_median"] = example["median_step_s"] / demo["median_step_s"]
            if example["median_step_cpu_s"] and demo["median_step_cpu_s"]:
                example["ratio_cpu"] = example["median_step_cpu_s"] / demo["median_step_cpu_s"]
    examples = [r for r in runs if "ratio_mean" in r]
    return {
        "steps": steps,
        "rounds": rounds,
        "runs": runs,
        # each round's ratio (its two runs side by side), then the median over rounds
        "ratio_mean": statistics.median(r["ratio_mean"] for r in examples),
        "ratio_median": statistics.median(r["ratio_median"] for r in examples),
        "ratio_cpu": statistics.median(r["ratio_cpu"] for r in examples if "ratio_cpu" in r),
        "example_final_val": [r["final_val_reward"] for r in examples],
    }


def against_baseline(steps: int, rounds: int, baseline: Path, log: Callable[[str], None]) -> dict:
    """The example with this checkout's server and with ``baseline``'s (another checkout, e.g. ``git worktree add
    /tmp/base main``), alternating which goes first: time and CPU seconds per step before and after a change."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="openrft-bench-tinker-") as tmp:
        for round_ in range(rounds):
            order = (("baseline", baseline), ("this", ROOT))
            for name, tree in order if round_ % 2 == 0 else order[::-1]:
                log(f"  round {round_ + 1}: the example against {name} ({tree}), {steps} steps")
                r = run_example(steps, Path(tmp) / f"{name}{round_}", steps, tree)
                r.update(round=round_ + 1, system=f"{name} ({tree})", checkout=name)
                log(f"    median {r['median_step_s']:.3f} s/step, {r['median_step_cpu_s']} CPU s/step")
                runs.append(r)
    return {"steps": steps, "rounds": rounds, "baseline": str(baseline), "runs": runs}
