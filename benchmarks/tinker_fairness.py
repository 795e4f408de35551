"""Fairness of the Tinker API among tenants (issue 49 point 6): tenant B's 6-token sample latency while tenant A
keeps its longest allowed ``forward_backward`` calls queued back to back, against a real ``openrft serve`` on
127.0.0.1 through the official SDK, with the fair schedule (``--tinker-schedule fair``, the default) and the old
arrival order (``fifo``) side by side.

    python -m benchmarks tinker-fairness [--fairness-samples 100] [--fairness-depth 8]
    python -m benchmarks.tinker_fairness [same options]

A's longest allowed call is the operator's bounds filled: ``--tinker-max-call-tokens`` tokens in datums of
``--tinker-max-sequence-tokens``, by default the server's own defaults (8192-token datums, 65,536 tokens a call:
about 40 s of work on the demo model; ``--fairness-sequence-tokens``/``--fairness-call-tokens`` choose others).
A keeps ``--fairness-depth`` such calls outstanding (the SDK sends a client's calls without waiting for their
results); B samples one prompt, 6 tokens (``stop=[]``), one request at a time with 0.2 s between them, for
``--fairness-samples`` requests or ``--fairness-max-s`` seconds, whichever ends first (under ``fifo`` each of
B's samples waits for whole calls of A's). Writes ``benchmarks/results/tinker_fairness.{md,json}`` (other bounds:
``tinker_fairness_TOKENSxDATUMS``) and prints one JSON line per schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import httpx

from benchmarks.common import RESULTS, load_average, markdown_table, write_results
from benchmarks.service_latency import CLI, free_port, percentiles
from openrft.service.tinker.settings import TinkerSettings

MODEL = "openrft-demo"
# engine.CHUNK_TOKENS and PIECE_TOKENS (not imported: the suite list loads without torch's model code)
CHUNK_TOKENS, PIECE_TOKENS = 1024, 512
DEFAULTS = TinkerSettings()
BODY_BYTES, BYTES_PER_TOKEN = 1_048_576, 16  # the server's default request body limit; a datum's bytes a token
SCHEDULES = ("fair", "fifo")


def longest_datums(sequence_tokens: int, call_tokens: int) -> int:
    """How many datums of ``sequence_tokens`` A's longest allowed call holds: the call bound, or fewer where its
    body would pass the server's request limit (1 MiB by default: about 16 bytes a token as the SDK sends it,
    int32 input, int64 targets, float32 weights; 65,536 tokens do not fit)."""
    return max(1, min(call_tokens // sequence_tokens, int(BODY_BYTES * 0.97) // (BYTES_PER_TOKEN * sequence_tokens)))


def _serve(root: Path, schedule: str, sequence_tokens: int, call_tokens: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_TELEMETRY": "0"}
    args = [
        *("serve", "--port", str(port), "--workers", "0", "--log-level", "warning"),
        *("--data-dir", str(root), "--database-url", f"sqlite:///{root / 'openrft.db'}"),
        *("--tinker-schedule", schedule),
        *("--tinker-max-sequence-tokens", str(sequence_tokens), "--tinker-max-call-tokens", str(call_tokens)),
    ]
    proc = subprocess.Popen([sys.executable, "-c", CLI, *args], env=env, stdout=subprocess.DEVNULL, stderr=None)
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def measure(
    schedule: str, samples: int, depth: int, sequence_tokens: int, call_tokens: int, max_s: float, log=print
) -> dict:
    import tinker
    from tinker import types

    from openrft.service.store import Store

    os.environ["TINKER_TELEMETRY"] = "0"
    with tempfile.TemporaryDirectory(prefix="openrft-fairness-") as tmp:
        root = Path(tmp)
        store = Store.open(f"sqlite:///{root / 'openrft.db'}")
        key_a, key_b = ("tml-" + store.create_key(name)[1] for name in ("tenant-a", "tenant-b"))
        store.close()
        proc, base = _serve(root, schedule, sequence_tokens, call_tokens)
        try:
            training = tinker.ServiceClient(base_url=base, api_key=key_a).create_lora_training_client(
                base_model=MODEL, rank=16, seed=0
            )
            sampler = tinker.ServiceClient(base_url=base, api_key=key_b).create_sampling_client(base_model=MODEL)
            longest = []  # the call at the operator's bounds, datums that share no prefix (none is computed once)
            for j in range(longest_datums(sequence_tokens, call_tokens)):
                tokens = [5 + ((7 * j + i) % 90) for i in range(sequence_tokens + 1)]
                longest.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * sequence_tokens},
                    )
                )
            prompt = types.ModelInput.from_ints([5, 17, 23, 42, 8])
            params = types.SamplingParams(max_tokens=6, stop=[], temperature=1.0)

            training.forward_backward(longest, "cross_entropy").result()  # warm-up: the model loads, threads set
            one_call = []
            for _ in range(3 if call_tokens <= 16384 else 1):  # a call at the default bounds runs about a minute
                t0 = time.perf_counter()
                training.forward_backward(longest, "cross_entropy").result()
                one_call.append(time.perf_counter() - t0)
            one_call_s = sorted(one_call)[len(one_call) // 2]
            for _ in range(3):
                sampler.sample(prompt, 1, params).result()
            alone = []
            for _ in range(5):
                t0 = time.perf_counter()
                sampler.sample(prompt, 1, params).result()
                alone.append(time.perf_counter() - t0)

            stop, calls = threading.Event(), [0]

            def tenant_a() -> None:
                outstanding: deque = deque()
                while not stop.is_set():
                    while len(outstanding) < depth:
                        outstanding.append(training.forward_backward(longest, "cross_entropy"))
                    future = outstanding.popleft()
                    future.result()
                    calls[0] += 1
                for future in outstanding:
                    future.result()

            a = threading.Thread(target=tenant_a, daemon=True)
            a.start()
            time.sleep(2 * one_call_s)  # A's backlog is queued
            latencies = []
            t_start = time.perf_counter()
            for _ in range(samples):
                if time.perf_counter() - t_start > max_s:
                    break
                t0 = time.perf_counter()
                result = sampler.sample(prompt, 1, params).result()
                latencies.append(time.perf_counter() - t0)
                assert len(result.sequences[0].tokens) == 6
                time.sleep(0.2)
            measured_s = time.perf_counter() - t_start
            a_calls = calls[0]
            stop.set()
            a.join(timeout=depth * one_call_s * 10 + 120)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    row = {
        "schedule": schedule,
        "b_samples": len(latencies),
        **{f"b_{k}": round(v, 1) for k, v in percentiles(latencies).items()},
        "b_max_ms": round(max(latencies) * 1000, 1),
        "b_alone_p50_ms": round(sorted(alone)[len(alone) // 2] * 1000, 1),
        "a_call_tokens": len(longest) * sequence_tokens,
        "a_datum_tokens": sequence_tokens,
        "a_depth": depth,
        "a_one_call_s": round(one_call_s, 2),
        "a_calls_per_s": round(a_calls / measured_s, 3),
    }
    log(json.dumps(row))
    return row


def suite(args: argparse.Namespace) -> dict:
    load = {"before": load_average()}
    rows = [
        measure(
            s,
            args.fairness_samples,
            args.fairness_depth,
            args.fairness_sequence_tokens,
            args.fairness_call_tokens,
            args.fairness_max_s,
        )
        for s in args.fairness_schedules
    ]
    load["after"] = load_average()
    fair, fifo = rows[0], rows[-1]
    ratio = {k: round(fifo[f"b_{k}_ms"] / fair[f"b_{k}_ms"], 1) for k in ("p50", "p99")} if len(rows) > 1 else None
    columns = [
        ("schedule", "schedule"),
        ("b_samples", "B samples:"),
        ("b_p50_ms", "B p50 ms:"),
        ("b_p99_ms", "B p99 ms:"),
        ("b_max_ms", "B max ms:"),
        ("b_alone_p50_ms", "B alone p50 ms:"),
        ("a_one_call_s", "A's call alone s (median of up to 3):"),
        ("a_calls_per_s", "A calls/s:"),
    ]
    body = [
        f"Tenant B's 6-token sample (one prompt, `stop=[]`, up to {args.fairness_samples} requests one at a time, "
        f"0.2 s apart, for at most {args.fairness_max_s:g} s) while tenant A keeps {args.fairness_depth} of its "
        f"longest allowed `forward_backward` calls outstanding ({fair['a_call_tokens']} tokens, the most of "
        f"`--tinker-max-call-tokens {args.fairness_call_tokens}` a 1 MiB request body holds, in datums of "
        "`--tinker-max-sequence-tokens "
        f"{args.fairness_sequence_tokens}`, computed in chunks of about {CHUNK_TOKENS} tokens, a longer datum in "
        f"pieces of {PIECE_TOKENS} along its sequence), demo model, LoRA rank 16, one `openrft serve --workers 0` per "
        "schedule, the official "
        "SDK for both tenants. With 100 requests or fewer, p99 is the slowest but at most one.",
        "",
        *markdown_table(columns, rows),
        "",
        f"FIFO / fair: {ratio['p50']}x at p50, {ratio['p99']}x at p99." if ratio else "",
    ]
    data = {"runs": rows, "ratio_fifo_over_fair": ratio, "load": load}
    title = "Tinker API: another tenant's short sample behind a long backlog"
    datums = fair["a_call_tokens"] // fair["a_datum_tokens"]
    bounds = (args.fairness_sequence_tokens, args.fairness_call_tokens)
    default = bounds == (DEFAULTS.max_sequence_tokens, DEFAULTS.max_call_tokens) and len(rows) > 1
    name = "tinker_fairness" if default else f"tinker_fairness_{fair['a_datum_tokens']}x{datums}"
    write_results(name, title, body, data, args.out)
    print(json.dumps({"benchmark": "tinker_fairness", "ratio_fifo_over_fair": ratio, "runs": rows}), flush=True)
    return data


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fairness-schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES), help="tinker-fairness: which"
    )
    parser.add_argument("--fairness-samples", type=int, default=100, help="tinker-fairness: B's sample requests")
    parser.add_argument("--fairness-depth", type=int, default=2, help="tinker-fairness: A's calls kept outstanding")
    parser.add_argument(
        "--fairness-max-s", type=float, default=180.0, help="tinker-fairness: B samples for at most this long"
    )
    parser.add_argument(
        "--fairness-sequence-tokens",
        type=int,
        default=DEFAULTS.max_sequence_tokens,
        help="tinker-fairness: --tinker-max-sequence-tokens (default: the server's)",
    )
    parser.add_argument(
        "--fairness-call-tokens",
        type=int,
        default=DEFAULTS.max_call_tokens,
        help="tinker-fairness: --tinker-max-call-tokens (default: the server's)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tinker_fairness")
    add_options(parser)
    parser.add_argument("--out", type=Path, default=RESULTS)
    suite(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
