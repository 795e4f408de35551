"""The step's model FLOPs against the machine (engine/step_flops.py): hand-computed counts on a tiny shape, and a
real demo job whose metrics.jsonl carries the fractions, consistent with its FLOPs, its times and the peak."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from openrft.engine import RFTJob
from openrft.engine.step_flops import StepFlops, machine_peak
from openrft.learner.batch import TrainSample
from openrft.learner.flops import DecoderShape, generation_flops
from openrft.spec.dialects import load_job

# hidden 4, intermediate 8, 1 layer, 2 heads of 2 (1 KV head), vocab 10: per token the linears cost
# 2 x (16 + 8 + 8 + 16 + 32 + 32 + 32) = 288 FLOPs, a rank-1 LoRA on each 2 x 64 = 128; attention 16 a
# (query, key) pair; the LM head 80 a position
TINY = DecoderShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_generation_flops_are_the_prefill_once_and_the_tokens_fed_back():
    """A 3-token prompt, responses of 2 and 1 tokens: the prefill (3 tokens, 6 pairs, the head once) and the first
    response's first token fed back (1 token seeing 4, the head once): 4 x (288 + 128) + 16 x 10 + 80 x 2."""
    assert generation_flops(TINY, [3], [[2, 1]], lora_rank=1) == 1984


def test_step_metrics_divide_each_phase_s_flops_by_its_seconds_and_the_peak():
    """Learning the same samples: forward 1984, backward 4 x (288 + 2 x 128) + 2 x 160 + 160 = 2656; full rank
    adds the linears' weight gradients, 4 x 288."""
    groups = [
        SimpleNamespace(
            prompt_ids=[1, 2, 3], completions=[SimpleNamespace(token_ids=[4, 5]), SimpleNamespace(token_ids=[6])]
        )
    ]
    samples = [TrainSample([1, 2, 3], [4, 5], 1.0), TrainSample([1, 2, 3], [6], -1.0)]
    flops = StepFlops(TINY, lora_rank=1, full_rank=False, reference=False, peak=1000.0)
    metrics = flops.metrics(groups, samples, step_s=2.0, generate_s=0.5, learn_s=1.0)
    assert metrics["perf/step_flops"] == 1984 + 4640
    assert metrics["perf/step_flops_fraction"] == pytest.approx((1984 + 4640) / 2.0 / 1000)
    assert metrics["perf/generate_flops_fraction"] == pytest.approx(1984 / 0.5 / 1000)
    assert metrics["perf/learn_flops_fraction"] == pytest.approx(4640 / 1.0 / 1000)
    full = StepFlops(TINY, lora_rank=1, full_rank=True, reference=True, peak=1000.0)
    assert full.metrics(groups, samples, 2.0, None, 1.0)["perf/step_flops"] == 1984 + 4640 + 4 * 288 + 1984 - 4 * 128
    assert "perf/generate_flops_fraction" not in full.metrics(groups, samples, 2.0, None, 1.0)  # not timed alone


def test_the_peak_is_measured_once_and_kept_on_disk(tmp_path, monkeypatch):
    import torch

    from openrft.engine import step_flops

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OPENRFT_MATMUL_PEAK_FLOPS", raising=False)
    monkeypatch.setattr(step_flops, "_peaks", {})
    peak = machine_peak(torch.device("cpu"), torch.float32)
    assert peak > 1e8  # any CPU of this century multiplies faster than 0.1 GFLOP/s
    cached = json.loads((tmp_path / "openrft" / "matmul_peak.json").read_text())
    assert [entry["flops"] for entry in cached.values()] == [peak]
    monkeypatch.setattr(step_flops, "_peaks", {})
    monkeypatch.setattr(step_flops, "matmul_peak", lambda *a, **k: pytest.fail("measured again"))
    assert machine_peak(torch.device("cpu"), torch.float32) == peak  # read back from the disk
    monkeypatch.setenv("OPENRFT_MATMUL_PEAK_FLOPS", "5e9")
    assert machine_peak(torch.device("cpu"), torch.float32) == 5e9


def test_a_demo_job_s_metrics_carry_its_flop_fractions(recipe_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENRFT_MATMUL_PEAK_FLOPS", "1e10")
    spec = load_job(recipe_factory(max_steps=2))
    run_dir = tmp_path / "run"
    assert RFTJob(spec, run_dir, show_progress=False).run()["status"] == "succeeded"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2
    for row in trained:
        assert row["perf/matmul_peak_flops"] == 1e10
        # the fraction is the step's FLOPs over its time over the peak
        assert row["perf/step_flops_fraction"] == pytest.approx(
            row["perf/step_flops"] / row["perf/time_per_step"] / 1e10
        )
        generate, learn = row["perf/generate_flops_fraction"], row["perf/learn_flops_fraction"]
        assert generate > 0 and learn > 0
        # the step holds both phases (and the rewards): its fraction is at most the better phase's
        assert row["perf/step_flops_fraction"] <= max(generate, learn)
