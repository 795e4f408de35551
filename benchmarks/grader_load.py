"""``/health`` latency while 45 slow ``graders/run`` calls are in flight, against a real ``openrft serve`` on
127.0.0.1 (bounded: one server, ``--calls`` requests, each grader sleeping ``--sleep`` seconds).

    python -m benchmarks.grader_load [--calls 45] [--sleep 5] [--src PATH ...]

Each ``--src`` names a source tree the server runs from (``src`` of this checkout by default; pass the
``src`` of an older checkout to measure it side by side). Writes ``benchmarks/results/grader_load.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import cpu_model
from benchmarks.service_latency import CLI, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GRADER = {
    "type": "python",
    "name": "slow",
    "source": "import time\ndef grade(sample, item):\n    time.sleep({sleep})\n    return 1.0\n",
}


def start_server(src: Path, data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", CLI, "serve", "--port", str(port), "--workers", "0"]
    command += ["--data-dir", str(data_dir), "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


async def load(base: str, calls: int, sleep: float) -> dict:
    grader = {**GRADER, "source": GRADER["source"].format(sleep=sleep)}
    body = {"grader": grader, "model_sample": "x", "item": {}}
    limits = httpx.Limits(max_connections=calls + 10)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        started = time.monotonic()
        graders = [
            asyncio.create_task(client.post("/v1/fine_tuning/alpha/graders/run", json=body)) for _ in range(calls)
        ]
        await asyncio.sleep(1.0)
        health: list[float] = []
        timeouts = 0
        async with httpx.AsyncClient(base_url=base, timeout=30) as probe:
            while not all(task.done() for task in graders) and time.monotonic() - started < 300:
                sent = time.monotonic()
                try:
                    await probe.get("/health")
                    health.append(time.monotonic() - sent)
                except httpx.TimeoutException:
                    timeouts += 1
                await asyncio.sleep(0.5)
        answers = await asyncio.gather(*graders, return_exceptions=True)
    statuses: dict[str, int] = {}
    for answer in answers:
        key = str(answer.status_code) if isinstance(answer, httpx.Response) else type(answer).__name__
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "health_probes": len(health),
        "health_timeouts_30s": timeouts,
        "health_max_s": max(health) if health else None,
        "health_p50_s": statistics.median(health) if health else None,
        "grader_answers": statuses,
        "all_graders_done_s": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=45)
    parser.add_argument("--sleep", type=float, default=5.0)
    parser.add_argument("--src", action="append", help="source trees to serve from (default: this checkout's src)")
    args = parser.parse_args(argv)
    results = {}
    for src in args.src or [str(ROOT / "src")]:
        with tempfile.TemporaryDirectory(prefix="openrft-grader-load-") as data:
            proc, base = start_server(Path(src), Path(data))
            try:
                results[src] = asyncio.run(load(base, args.calls, args.sleep))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        print(src, json.dumps(results[src]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(), **vars(args)}
    (RESULTS / "grader_load.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [
        f"`python -m benchmarks.grader_load --calls {args.calls} --sleep {args.sleep}` on {meta['cpu']} "
        f"({meta['cpus']} CPUs)",
        "",
        "| server source | /health probes | max | median | timed out (30 s) | grader answers | all done |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for src, r in results.items():
        fmt = lambda v: "-" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
        lines.append(
            f"| {src} | {r['health_probes']} | {fmt(r['health_max_s'])} | {fmt(r['health_p50_s'])} | "
            f"{r['health_timeouts_30s']} | {r['grader_answers']} | {r['all_graders_done_s']:.0f} s |"
        )
    (RESULTS / "grader_load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
