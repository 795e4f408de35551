"""Learner throughput (tokens/s, achieved FLOP/s against measured matmul FLOP/s) and peak memory per step.

Memory is measured in a fresh subprocess per configuration: the kernel's resident-memory high-water
mark is reset (``/proc/self/clear_refs``) just before the step and read after it, so the figure is
the step's own peak, not the process's history.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, matmul_peak, median_after_warmup
from benchmarks.demo import Demo, demo_spec, response_tokens, sequence_tokens
from openrft.learner.batch import collate
from openrft.learner.flops import DecoderShape, learner_step_flops


def shape_flops(shape: DecoderShape, rows: int, dtype: torch.dtype = torch.float32, seconds: float = 0.5) -> float:
    """FLOP/s of the model's own linear layers at ``rows`` tokens (its matmuls, not a square one): how fast the
    hardware runs the shapes this model has."""
    device = torch.device("cpu")
    total_flops, total_time = 0, 0.0
    for a, b in shape.linears():
        x = torch.randn(rows, a, dtype=dtype, device=device)
        w = torch.randn(b, a, dtype=dtype, device=device)
        torch.nn.functional.linear(x, w)
        deadline, best = time.perf_counter() + seconds / len(shape.linears()), float("inf")
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - start)
        total_flops += 2 * rows * a * b
        total_time += best
    return total_flops / total_time


MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}


def step_breakdown(step, top: int = 0) -> dict:
    """Shares of one profiled call of ``step``: time inside matmul kernels, inside attention kernels, inside every
    other op, and outside any op (Python, autograd bookkeeping, dispatch); the matmul kernels' own FLOP/s (the
    profiler's count of their FLOPs over their time); with ``top``, the ``top`` ops by time inside them. The
    profiler slows the step, so these are shares, not times."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        step()
    wall_us = (time.perf_counter() - start) * 1e6
    matmul = attention = other = 0.0
    matmul_flops = ops = 0
    events = prof.key_averages()
    for event in events:
        ops += event.count
        if event.key in MATMUL_OPS:
            matmul += event.self_cpu_time_total
            matmul_flops += event.flops or 0
        elif "scaled_dot_product" in event.key or "attention" in event.key:
            attention += event.self_cpu_time_total
        else:
            other += event.self_cpu_time_total
    outside = max(0.0, wall_us - matmul - attention - other)
    heaviest = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "matmul": matmul / wall_us,
        "attention": attention / wall_us,
        "other_ops": other / wall_us,
        "outside_ops": outside / wall_us,
        "op_calls": float(ops),
        "matmul_flops": float(matmul_flops),
        "matmul_kernel_flops_per_s": matmul_flops / (matmul * 1e-6) if matmul else 0.0,
        "top_ops": [
            {"op": e.key, "share": round(e.self_cpu_time_total / wall_us, 4), "calls": e.count} for e in heaviest
        ],
    }


def learner_throughput(prompts: int, n: int, steps: int, warmup: int, threads: int | None) -> dict:
    """Learner steps on one real rollout batch of the demo job (``prompts`` x ``n`` samples)."""
    demo = Demo.build(demo_spec(threads))
    try:
        samples = demo.rollout(prompts, n)
        times = []
        for _ in range(warmup + steps):
            start = time.perf_counter()
            demo.learner.step(samples)
            times.append(time.perf_counter() - start)
        step_s = median_after_warmup(times, warmup)
        shape = DecoderShape.from_config(demo.parts.model.config)
        rank = demo.spec.lora.rank
        reference = demo.learner.use_kl
        flops = learner_step_flops(shape, samples, rank, reference)
        naive_flops = learner_step_flops(shape, samples, rank, reference, shared_prefix=False)
        peak, peak_by_size = matmul_peak(torch.device("cpu"), torch.float32)
        rows = max(1, response_tokens(samples) + prompts)  # tokens in one pass, roughly
        at_shape = shape_flops(shape, rows)
        breakdown = step_breakdown(lambda: demo.learner.step(samples))
        achieved = flops / step_s
        best_s = min(times[warmup:])
        return {
            "prompts": prompts,
            "samples_per_prompt": n,
            "samples": len(samples),
            "response_tokens": response_tokens(samples),
            "sequence_tokens": sequence_tokens(samples),
            "step_s": step_s,
            "step_times": times,
            "response_tokens_per_s": response_tokens(samples) / step_s,
            "sequence_tokens_per_s": sequence_tokens(samples) / step_s,
            "model_flops": flops,
            "model_flops_without_shared_prefix": naive_flops,
            "achieved_flops_per_s": achieved,
            "achieved_flops_per_s_best_step": flops / best_s,
            "matmul_peak_flops_per_s": peak,
            "matmul_flops_per_s_by_size": peak_by_size,
            "fraction_of_matmul_peak": achieved / peak,
            "fraction_of_matmul_peak_best_step": flops / best_s / peak,
            "matmul_flops_per_s_at_model_shapes": at_shape,
            "fraction_of_model_shape_matmul": achieved / at_shape,
            "threads": torch.get_num_threads(),
            "breakdown": breakdown,
        }
    finally:
        demo.close()


# memory --------------------------------------------------------------------------------------------


def _resident_kib() -> tuple[int, int]:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    return rss, hwm


def _release_free_memory() -> None:
    """Hand freed heap memory back to the kernel (glibc keeps it resident otherwise, and later allocations
    would reuse it without showing in the resident-memory peak)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_probe(prompts: int, n: int, micro_batch_tokens: int, threads: int | None) -> dict:
    """Peak resident memory of one generation and one learner step (run in a fresh process)."""
    demo = Demo.build(demo_spec(threads, micro_batch_tokens=micro_batch_tokens))
    try:
        demo.rollout(2, n)  # warm up lazy allocations
        demo.learner.step(demo.rollout(2, n))
        _release_free_memory()
        base, _ = _resident_kib()
        exact = _reset_peak()
        samples = demo.rollout(prompts, n)
        _, generation_peak = _resident_kib()
        _release_free_memory()
        before_learner, _ = _resident_kib()
        _reset_peak()
        demo.learner.step(samples)
        _, learner_peak = _resident_kib()
        micro_batches = demo.learner.plan(samples)
        pad = demo.parts.tokenizer.pad_token_id
        largest = max(collate([samples[i] for i in mb], pad, torch.device("cpu")).padded_tokens for mb in micro_batches)
        return {
            "prompts": prompts,
            "samples_per_prompt": n,
            "samples": len(samples),
            "micro_batch_tokens": micro_batch_tokens,
            "micro_batches": len(micro_batches),
            "largest_micro_batch_tokens": largest,
            "baseline_mib": base / 1024,
            "generation_peak_mib": generation_peak / 1024,
            "learner_peak_mib": learner_peak / 1024,
            "learner_peak_over_baseline_mib": (learner_peak - before_learner) / 1024,
            "exact_peak": exact,
        }
    finally:
        demo.close()


def memory_in_subprocess(prompts: int, n: int, micro_batch_tokens: int, threads: int | None) -> dict:
    args = json.dumps({"prompts": prompts, "n": n, "micro_batch_tokens": micro_batch_tokens, "threads": threads})
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.learner", "--memory-probe", args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"memory probe failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_scaling(
    global_batches: list[int],
    micro_budgets: list[int],
    fixed_micro: int,
    fixed_prompts: int,
    n: int,
    threads: int | None,
    log=print,
) -> dict:
    """Peak learner memory (a) as the global batch grows at a fixed micro-batch budget, (b) as the
    micro-batch budget grows at a fixed global batch."""
    by_global = []
    for prompts in global_batches:
        row = memory_in_subprocess(prompts, n, fixed_micro, threads)
        log(
            f"  global batch {row['samples']:5d} samples, micro {fixed_micro} tokens: "
            f"learner +{row['learner_peak_over_baseline_mib']:.0f} MiB over baseline"
        )
        by_global.append(row)
    by_micro = []
    for budget in micro_budgets:
        row = memory_in_subprocess(fixed_prompts, n, budget, threads)
        log(
            f"  global batch {row['samples']:5d} samples, micro {budget} tokens: "
            f"learner +{row['learner_peak_over_baseline_mib']:.0f} MiB over baseline"
        )
        by_micro.append(row)
    fit_micro = _fit(by_micro, key="largest_micro_batch_tokens")
    return {
        "by_global_batch": by_global,
        "by_micro_batch": by_micro,
        "fit_micro": fit_micro,
        "fit_global": _fit(by_global, key="samples"),
    }


def _fit(rows: list[dict], key: str = "micro_batch_tokens") -> dict:
    """Least-squares line of the learner's peak over baseline (MiB) against ``key``: slope, intercept, R^2."""
    xs = [float(r[key]) for r in rows]
    ys = [r["learner_peak_over_baseline_mib"] for r in rows]
    if len(xs) < 2 or max(xs) == min(xs):
        return {}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys) or 1.0
    return {"slope_mib_per_unit": slope, "intercept_mib": intercept, "r2": 1 - ss_res / ss_tot}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-probe":
        a = json.loads(sys.argv[2])
        print(json.dumps(memory_probe(a["prompts"], a["n"], a["micro_batch_tokens"], a["threads"])))
    else:
        sys.exit("usage: python -m benchmarks.learner --memory-probe JSON (run `python -m benchmarks learner`)")
