"""What the sync probe costs (``engine/sync_check.py``): its share of a training step.

Demo shape: the demo recipe as an asynchronous job (``off_policy_async``, age tolerance 0, one in-process generation
replica, so the weights are sent after every update and probed), run twice side by side, probe on and off; per step,
the probe's seconds (``sync/probe_s``: the learner's scoring and the replica's) against the step's.

Real shape: the probe's two scorings (learner and replica) on a Qwen2.5-0.5B-shaped model (random weights, built in
memory), against the step that benchmarks/results/real_shape.json measured at that shape and thread count.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS
from benchmarks.demo import demo_spec


def demo_run(steps: int, threads: int, probe: bool, workdir: Path) -> dict:
    from openrft.engine import RFTJob

    spec = demo_spec(threads)
    spec.training.total_steps = steps
    spec.rollout.strategy, spec.rollout.age_tolerance = "off_policy_async", 0
    spec.rollout.sync_probe.enabled = probe
    spec.evaluation.at_start, spec.evaluation.interval = False, 0
    spec.checkpoint.interval = 0
    run_dir = workdir / ("probe" if probe else "no-probe")
    RFTJob(spec, run_dir, show_progress=False).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/time_per_step" in r][1:]  # the first step warms up
    step = statistics.median(r["perf/time_per_step"] for r in rows)
    result = {"probe": probe, "steps_timed": len(rows), "step_s": round(step, 3)}
    if probe:
        probe_s = statistics.median(r["sync/probe_s"] for r in rows)
        result.update(
            probe_s=round(probe_s, 4),
            probe_fraction=round(probe_s / step, 5),
            max_logprob_diff=max(r["sync/max_logprob_diff"] for r in rows),
        )
    return result


def real_shape_probe(threads: int, layers: int = 24, repeats: int = 3) -> dict:
    """The probe's two scorings on Qwen2.5-0.5B's shape (2 prompts of the demo's length + 16 tokens each)."""
    from transformers import Qwen2ForCausalLM

    from benchmarks.sharding import model_config
    from openrft.rollout.sync_probe import ProbeSet, score_with_model

    config = model_config(layers)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, config.vocab_size, (40,), generator=g).tolist() for _ in range(2)]
    probe = ProbeSet(prompts, [p[:16] for p in reversed(prompts)])
    torch.set_num_threads(threads)
    score_with_model(model, probe)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        score_with_model(model, probe)  # the learner's
        score_with_model(model, probe)  # the replica's
        times.append(time.perf_counter() - started)
    probe_s = statistics.median(times)
    measured = json.loads((RESULTS / "real_shape.json").read_text())
    step = next(r["step_s"] for r in measured["rows"] if r["system"] == "openrft" and r["threads"] == threads)
    return {
        "threads": threads,
        "probe_s": round(probe_s, 3),
        "step_s (real_shape.json)": step,
        "probe_fraction": round(probe_s / step, 5),
    }


def run(steps: int, threads: int, quick: bool) -> tuple[list[dict], dict]:
    with tempfile.TemporaryDirectory() as tmp:
        demo = [demo_run(steps, threads, probe, Path(tmp)) for probe in (True, False)]
    demo[0]["step_vs_no_probe"] = round(demo[0]["step_s"] / demo[1]["step_s"], 3)
    real = real_shape_probe(threads, layers=2 if quick else 24)
    return demo, real
