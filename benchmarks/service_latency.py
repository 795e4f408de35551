"""Job-list and job-get latency of the job service with 10,000 jobs in the store, SQLite and PostgreSQL
side by side, measured over HTTP against a real ``openrft serve`` process on 127.0.0.1.

    python -m benchmarks.service_latency [--jobs 10000] [--requests 500] [--postgres-url postgresql://...]

PostgreSQL is measured when ``--postgres-url`` or ``OPENRFT_TEST_POSTGRES_URL`` names a server (a
database of its own is created and dropped there). Writes ``benchmarks/results/service_latency.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.common import cpu_model
from openrft.service.store import Store
from openrft.service.store.base import new_id, now, now_s
from openrft.service.store.models import Job

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLI = "import sys; from openrft.cli import main; sys.exit(main())"
OWNERS = ("local", "other-tenant")


def sample_spec() -> dict:
    """A real resolved JobSpec (the demo recipe's), so rows have the size they have in use."""
    from openrft.spec.dialects import parse_document

    recipe = {
        "run": {"name": "bench", "model_name_or_path": "openrft-demo", "data_s3_path": "/data/train.jsonl"},
        "training_config": {
            "global_batch_size": 16,
            "trainer": {"max_steps": 10, "peft": {"peft_scheme": "lora"}},
            "rollout": {"rewards": {"preset_reward_function": "exact_match"}},
        },
    }
    return parse_document(recipe, "nova", dataset_size=lambda location: 1000).model_dump(mode="json")


def fill(store: Store, count: int) -> list[str]:
    """``count`` jobs for the tenant ``local`` and as many for another tenant, in batches."""
    spec, ids, created = sample_spec(), [], now_s() - count
    request = {"model": "openrft-demo", "training_file": "file-0", "method": {"type": "reinforcement"}}
    for start in range(0, count, 1000):
        with store.session() as s:
            for i in range(start, min(count, start + 1000)):
                for owner in OWNERS:
                    job = Job(
                        id=new_id("ftjob-"),
                        owner=owner,
                        api="openai",
                        status="succeeded",
                        request=request,
                        spec=spec,
                        model="openrft-demo",
                        training_file="file-0",
                        total_steps=10,
                        last_step=10,
                        created_at=created + i,
                        updated_at=now(),
                        attempts=1,
                    )
                    s.add(job)
                    if owner == "local":
                        ids.append(job.id)
    return ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(database_url: str, data_dir: Path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "serve",
            "--port",
            str(port),
            "--workers",
            "0",
            "--data-dir",
            str(data_dir),
            "--database-url",
            database_url,
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not start")
        yield base
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    rank = lambda q: ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]  # noqa: E731
    return {"p50_ms": rank(50) * 1000, "p99_ms": rank(99) * 1000, "mean_ms": statistics.fmean(ordered) * 1000}


def measure(base: str, ids: list[str], requests: int) -> dict[str, dict[str, float]]:
    rng = random.Random(0)
    newest = ids[::-1]
    cases = {
        "list (first page, limit 20)": lambda: "/v1/fine_tuning/jobs?limit=20",
        "list (deep page, after the 5,000th)": lambda: f"/v1/fine_tuning/jobs?limit=20&after={newest[len(ids) // 2]}",
        "get (random job)": lambda: f"/v1/fine_tuning/jobs/{rng.choice(ids)}",
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(20):  # warm caches and connections
            for path in cases.values():
                client.get(path()).raise_for_status()
        for _ in range(requests):  # interleaved, so that load from elsewhere falls on every row alike
            for name, path in cases.items():
                url = path()
                started = time.perf_counter()
                client.get(url).raise_for_status()
                samples[name].append(time.perf_counter() - started)
    return {name: percentiles(values) for name, values in samples.items()}


@contextmanager
def postgres_database(admin_url: str):
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from openrft.service.store.db import normalise_url

    admin_url = normalise_url(admin_url)
    name = f"openrft_bench_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run_backend(name: str, url: str, data_dir: Path, jobs: int, requests: int) -> dict:
    store = Store.open(url)
    started = time.perf_counter()
    ids = fill(store, jobs)
    fill_s = time.perf_counter() - started
    store.close()
    with server(url, data_dir) as base:
        results = measure(base, ids, requests)
    print(f"{name}: filled {2 * jobs} jobs in {fill_s:.1f}s", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.service_latency")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs of the measured tenant (another has as many)")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--postgres-url", default=os.environ.get("OPENRFT_TEST_POSTGRES_URL"))
    args = parser.parse_args(argv)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["SQLite"] = run_backend(
            "SQLite", f"sqlite:///{tmp}/bench.db", Path(tmp) / "sqlite", args.jobs, args.requests
        )
        if args.postgres_url:
            with postgres_database(args.postgres_url) as url:
                results["PostgreSQL"] = run_backend("PostgreSQL", url, Path(tmp) / "pg", args.jobs, args.requests)
    backends = list(results)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"Job service latency over HTTP, {args.jobs:,} jobs of the tenant (and {args.jobs:,} of another) in "
        f"the store, {args.requests} requests per row, one client, keep-alive; {cpu_model()}, "
        f"{os.cpu_count()} cores (load average {load} after the run), Python {platform.python_version()}.",
        "",
        "| request | " + " | ".join(f"{b} p50 ms | {b} p99 ms" for b in backends) + " |",
        "|---|" + "---:|---:|" * len(backends),
    ]
    for case in results[backends[0]]:
        cells = " | ".join(f"{results[b][case]['p50_ms']:.1f} | {results[b][case]['p99_ms']:.1f}" for b in backends)
        lines.append(f"| {case} | {cells} |")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "service_latency.md").write_text(table + "\n")
    (RESULTS / "service_latency.json").write_text(
        json.dumps({"jobs": args.jobs, "requests": args.requests, "results": results}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
