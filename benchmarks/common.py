"""What every benchmark needs: the machine and versions, load, robust timing, matmul peak, result files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import torch

from openrft.engine.step_flops import matmul_flops, matmul_peak, sync  # noqa: F401 (the suites' names)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PACKAGES = ("torch", "transformers", "peft", "accelerate", "trl", "datasets")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        # uncommitted changes to what the numbers depend on (results written earlier in the run are not)
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "src",
                "benchmarks",
                "examples",
                "pyproject.toml",
                ":!benchmarks/results",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def machine_info() -> dict:
    import psutil

    info = {
        "cpu": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": versions(),
        "git_commit": git_commit(),
    }
    return info


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: the machine is shared, so every result says how busy it was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def median_after_warmup(times: list[float], warmup: int) -> float:
    """Median of ``times`` without the first ``warmup`` (allocator, caches and lazy imports settle there)."""
    kept = times[warmup:] if len(times) > warmup else times
    return statistics.median(kept)


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample std, min and max of a few runs (the std is 0 for a single run)."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` after ``warmup`` unmeasured calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[int]:
    """Run a block with ``count`` torch intra-op threads (``None``: leave as is)."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def pinned_cores(count: int) -> Iterator[set[int]]:
    """Run a block on the first ``count`` of the CPUs this thread may use (``os.sched_setaffinity``): what the
    engine sees as the machine's cores (``models.machine_cpus``), and what processes it starts inherit."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:count])
    try:
        yield os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)


class NoText:
    """A tokenizer stand-in for models fed random token ids: there is no text worth decoding."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def run_worker(command: list[str], threads: int, timeout: float, identity: dict, env: dict | None = None) -> dict:
    """Run a benchmark worker (``python -m benchmarks.X --worker ...``) in a fresh process with ``threads``
    OpenMP threads (and ``env`` added); its last JSON line, or ``identity`` with the error (a timeout, or the
    end of stderr)."""
    env = {
        **os.environ,
        **(env or {}),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
    }
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**identity, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**identity, "error": done.stderr[-2000:]}
    return json.loads(lines[-1])


def markdown_table(columns: list[tuple[str, str]], rows: list[dict]) -> list[str]:
    """``columns`` are (key, header) pairs; a header ending in ':' is right-aligned (numbers)."""
    headers = [h.rstrip(":") for _, h in columns]
    aligns = ["---:" if h.endswith(":") else "---" for _, h in columns]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(aligns) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key)) for key, _ in columns) + " |")
    return lines


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def command_line() -> str:
    args = " ".join(sys.argv[1:])
    return f"python -m benchmarks {args}".strip() if sys.argv[0].endswith("__main__.py") else " ".join(sys.argv)


def write_results(name: str, title: str, body: list[str], data: dict, results_dir: Path = RESULTS) -> Path:
    """``results_dir/name.md`` (title, machine, command, load, then ``body``) and ``name.json`` (``data`` plus the same
    header fields)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    header = {
        "benchmark": name,
        "command": data.get("command") or command_line(),
        "machine": machine_info(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    data = {**header, **data}
    (results_dir / f"{name}.json").write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    m = header["machine"]
    lines = [
        f"# {title}",
        "",
        f"- command: `{header['command']}`",
        f"- machine: {m['cpu']}, {m['physical_cores']} physical cores, {m['memory_gib']} GiB, {m['os']}"
        + (f", GPU {m['cuda']}" if m["cuda"] else ""),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- commit: {m['git_commit']}; finished {header['finished']}",
    ]
    if "load" in data:
        lines.append(
            f"- load average (1, 5, 15 min) before: {data['load'].get('before')}, after: {data['load'].get('after')}"
        )
    lines += ["", *body]
    path = results_dir / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
