"""The benchmark harness's arithmetic: medians, tables, the side-by-side summary, the noise verdict, line fits."""

import pytest

from benchmarks.__main__ import parse_args
from benchmarks.common import markdown_table, median_after_warmup, spread
from benchmarks.learner import _fit, step_breakdown
from benchmarks.vs_trl import RunResult, summarise, verdict


def test_median_after_warmup_and_spread():
    assert median_after_warmup([9.0, 1.0, 3.0, 2.0], warmup=1) == 2.0
    assert median_after_warmup([5.0], warmup=2) == 5.0  # too short to drop anything
    s = spread([1.0, 2.0, 3.0])
    assert (s["mean"], s["std"], s["min"], s["max"]) == (2.0, 1.0, 1.0, 3.0)


def test_markdown_table_aligns_numbers_right():
    lines = markdown_table([("name", "name"), ("v", "value:")], [{"name": "a", "v": 0.12345}, {"name": "b"}])
    assert lines == ["| name | value |", "| --- | ---: |", "| a | 0.123 |", "| b | - |"]


def _run(system, seed, step, final):
    return RunResult(
        system,
        seed,
        step_times=[5.0, step, step, step],
        step_cpu=[5.0, step, step, step],
        intervals=[5.0, step, step, step],
        val_reward={0: 0.2, 10: final},
    )


def test_summary_pairs_seeds_and_reports_ratios():
    runs = [
        _run("OpenRFT", 0, 0.25, 0.30),
        _run("TRL GRPOTrainer", 0, 1.0, 0.28),
        _run("TRL GRPOTrainer", 1, 0.9, 0.32),
        _run("OpenRFT", 1, 0.3, 0.31),
    ]
    s = summarise(runs, warmup=1)
    assert s["speedup_per_seed"] == pytest.approx([4.0, 3.0])
    assert s["speedup_median"] == pytest.approx(3.5)
    assert [c["step"] for c in s["openrft_curve"]] == [0, 10]
    assert s["openrft_curve"][1]["mean"] == pytest.approx(0.305)


def test_verdict_against_noise():
    close = {
        "openrft_final_val": {"mean": 0.30, "std": 0.02},
        "trl_final_val": {"mean": 0.31, "std": 0.02},
        "speedup_per_seed": [3.0, 3.0, 3.0],
    }
    assert "not lower beyond run-to-run noise" in verdict(close)
    far = {**close, "openrft_final_val": {"mean": 0.20, "std": 0.01}}
    assert "lower beyond noise" in verdict(far) and "not lower" not in verdict(far)


def test_linear_fit_of_memory():
    rows = [{"micro_batch_tokens": x, "learner_peak_over_baseline_mib": 10 + 0.1 * x} for x in (256, 512, 1024)]
    fit = _fit(rows)
    assert fit["slope_mib_per_unit"] == pytest.approx(0.1) and fit["r2"] == pytest.approx(1.0)


def test_runner_arguments():
    args = parse_args([])
    assert args.suites == [
        "vs-trl",
        "rollout",
        "learner",
        "memory",
        "optimizations",
        "threads",
        "sampling",
        "long-context",
        "sharding",
        "tools",
    ]
    assert args.sharding_steps == 3
    assert args.long_tokens == [4096, 8192, 16384, 32768] and args.long_unchunked == [4096]
    custom = parse_args(["long-context", "--long-tokens", "1024,2048", "--long-unchunked=", "--long-generate", "512"])
    assert custom.long_tokens == [1024, 2048] and custom.long_unchunked == [] and custom.long_generate == [512]
    assert args.lrs == [None, 5e-5] and args.steps == 60 and args.seeds == 3
    assert parse_args(["vllm"]).suites == ["vllm"] and args.vllm_steps == 8  # vllm only when asked (.venv-vllm)
    real = parse_args(["real-shape"])  # hours: only when asked
    assert real.suites == ["real-shape"] and (real.real_layers, real.real_tokens, real.real_prompts) == (24, 128, 8)
    assert real.real_thread_counts == [1, 2]
    assert parse_args(["real-shape", "--real-thread-counts", "2"]).real_thread_counts == [2]
    assert not args.engine_threads and parse_args(["vs-trl", "--engine-threads"]).engine_threads
    assert "real-shape-profile" not in args.suites and parse_args(["real-shape-profile"]).real_profile_groups == 2
    quick = parse_args(["vs-trl", "--quick"])
    assert quick.steps == 4 and quick.lrs == [None] and quick.out.name.startswith("openrft-bench-quick-")
    quick.out.rmdir()
    with pytest.raises(SystemExit):
        parse_args(["nonsense"])


def test_long_context_rows_are_one_json_line_per_length(monkeypatch):
    import json

    import benchmarks.long_context as lc

    def fake_probe(kind, tokens, threads, timeout):  # the subprocess itself runs in `python -m benchmarks --quick`
        if kind == "generate" and tokens == 2048:
            return {"kind": kind, "tokens": tokens, "error": "over 1 s"}
        return {"kind": kind, "tokens": tokens, "seconds": 2.0 if kind == "train" else 4.0, "peak_mib_above_model": 7.0}

    monkeypatch.setattr(lc, "probe_in_subprocess", fake_probe)
    lines = []
    rows = lc.long_context([1024, 2048], [1024], [1024, 2048], 1, 1.0, log=lines.append)
    assert [json.loads(line) for line in lines] == rows
    assert rows[0]["tokens"] == 1024 and rows[0]["step_s"] == 2.0 and rows[0]["peak_mib_above_model"] == 7.0
    assert rows[0]["chunked_over_unchunked_time"] == 0.5 and rows[0]["generate_ms_per_token"] == 4000 / 1024
    assert "unchunked_step_s" not in rows[1] and rows[1]["generate_error"] == "over 1 s"


def test_step_breakdown_counts_the_matmul_kernels_flops():
    import torch

    a, b = torch.randn(128, 256), torch.randn(256, 64)
    shares = step_breakdown(lambda: [a @ b for _ in range(5)], top=3)
    heaviest = shares["top_ops"][0]
    assert (heaviest["op"], heaviest["calls"]) == ("aten::mm", 5) and shares["matmul"] > 0
    assert shares["matmul_flops"] == 5 * 2 * 128 * 256 * 64  # 2mnk per product, counted by the profiler
    assert shares["matmul_kernel_flops_per_s"] > 0
    no_matmul = step_breakdown(lambda: a.exp().sum())
    assert no_matmul["matmul"] == 0 and no_matmul["matmul_flops"] == 0 and no_matmul["matmul_kernel_flops_per_s"] == 0
