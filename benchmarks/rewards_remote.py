"""Samples per second through the remote Nova reward contract: batched and concurrent versus one
call per sample, against the example reward server on 127.0.0.1, measured side by side.

    python -m benchmarks.rewards_remote [--samples 512] [--delay 0.02] [--per-sample-delay 0.001]

The server simulates a reward that costs ``delay`` seconds per call (network round trip, model
load, process start) plus ``per_sample_delay`` per sample. Writes
``benchmarks/results/rewards_remote.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from openrft.data.records import Example
from openrft.rewards import RewardSample, build_reward
from openrft.spec.rewards import RewardSpec

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "reward_server" / "server.py"
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = [
    ("one call per sample", 1, 1),
    ("batched (32 per call)", 32, 1),
    ("concurrent (8 in flight)", 1, 8),
    ("batched + concurrent (32 x 8)", 32, 8),
    ("Nova default shape (128 x 12)", 128, 12),
]


def samples(count: int) -> list[RewardSample]:
    out = []
    for i in range(count):
        a, b = i % 50, (i * 7) % 50
        example = Example(
            id=f"b-{i}",
            messages=[{"role": "user", "content": f"What is {a}+{b}?"}],
            fields={"reference_answer": str(a + b)},
        )
        out.append(RewardSample(example, str(a + b if i % 3 else a + b + 1), step=1, sample_index=i))
    return out


def measure(url: str, batch: list[RewardSample], batch_size: int, concurrency: int) -> dict:
    spec = RewardSpec.model_validate(
        {
            "function": {
                "type": "nova_lambda",
                "endpoint": url,
                "batch_size": batch_size,
                "concurrency_limit": concurrency,
            }
        }
    )
    reward = build_reward(spec)

    async def go():
        try:
            await reward.score(batch[:4])  # connection warm-up
            start = time.perf_counter()
            outcomes = await reward.score(batch)
            return time.perf_counter() - start, outcomes
        finally:
            await reward.aclose()

    elapsed, outcomes = asyncio.run(go())
    errors = sum(not o.ok for o in outcomes)
    mean = sum(o.score for o in outcomes if o.ok) / max(1, len(outcomes) - errors)
    return {
        "batch_size": batch_size,
        "concurrency": concurrency,
        "seconds": elapsed,
        "samples_per_second": len(batch) / elapsed,
        "errors": errors,
        "mean_reward": mean,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--delay", type=float, default=0.02, help="server seconds per call")
    parser.add_argument("--per-sample-delay", type=float, default=0.001, help="server seconds per sample")
    args = parser.parse_args(argv)
    server = subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--port",
            "0",
            "--delay",
            str(args.delay),
            "--per-sample-delay",
            str(args.per_sample_delay),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = re.search(r"(http://\S+/)", server.stdout.readline()).group(1)  # type: ignore[union-attr]
        batch = samples(args.samples)
        rows = []
        for label, batch_size, concurrency in CONFIGS:
            row = {"config": label, **measure(url, batch, batch_size, concurrency)}
            rows.append(row)
            print(
                f"{label:34s} {row['samples_per_second']:9.1f} samples/s  ({row['seconds']:.2f} s, "
                f"errors {row['errors']})",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
    base = rows[0]["samples_per_second"]
    result = {
        "command": "python -m benchmarks.rewards_remote " + " ".join(argv or sys.argv[1:]),
        "samples": args.samples,
        "server_delay_s": args.delay,
        "server_per_sample_delay_s": args.per_sample_delay,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "rows": [{**r, "speedup": r["samples_per_second"] / base} for r in rows],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rewards_remote.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Remote Nova reward throughput ({args.samples} samples)",
        "",
        f"Server: example reward server on 127.0.0.1, {args.delay * 1000:g} ms per call + "
        f"{args.per_sample_delay * 1000:g} ms per sample. Command: `{result['command'].strip()}`.",
        "",
        "| configuration | batch size | calls in flight | seconds | samples/s | speedup |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['config']} | {r['batch_size']} | {r['concurrency']} | {r['seconds']:.2f} | "
            f"{r['samples_per_second']:.1f} | {r['speedup']:.1f}x |"
        )
    (RESULTS / "rewards_remote.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'rewards_remote.md'}")


if __name__ == "__main__":
    main()
