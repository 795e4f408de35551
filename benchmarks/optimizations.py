"""What each optimisation buys: the engine against itself with one optimisation taken out, side by side.

Learner rows time ``Learner.step`` on the same real rollout batch of the demo job, the variants
(``benchmarks.variants``) interleaved so that the machine's load falls on all of them alike.
Generation rows time ``TransformersGenerator.generate`` the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.common import ROOT, NoText, load_average, median_after_warmup, threads
from benchmarks.demo import Demo
from benchmarks.variants import (
    CopiedReferenceLearner,
    FullHeadLearner,
    FullSequenceLearner,
    GatheredPrefixLearner,
    SecondPassLearner,
    ShuffledFixedLearner,
    gathered_prompt_cache,
)
from openrft.learner import Learner
from openrft.learner.batch import collate
from openrft.learner.flops import full_sequence_count, groups_of, shared_prefix_count

LEARNER_VARIANTS: dict[str, tuple[type[Learner], str]] = {
    "engine": (Learner, "all optimisations"),
    "no shared prefix in training": (FullSequenceLearner, "every sample's prompt recomputed, policy and reference"),
    "prompt cache gathered onto every row": (
        GatheredPrefixLearner,
        "each response attends to its own copy of its prompt's keys",
    ),
    "second pass for old log-probs": (SecondPassLearner, "an extra no-grad policy forward per micro-batch"),
    "reference as a second model": (CopiedReferenceLearner, "a frozen copy loaded from the checkpoint"),
    "LM head on every position": (FullHeadLearner, "logits for prompt positions too"),
    "fixed 16-sample micro-batches, shuffled": (ShuffledFixedLearner, "TRL's layout instead of token-planned"),
}


def padded_tokens(learner: Learner, samples) -> int:
    pad = learner.config.pad_token_id
    return sum(
        collate([samples[i] for i in plan], pad, torch.device("cpu")).padded_tokens for plan in learner.plan(samples)
    )


def learner_ablation(demo: Demo, prompts: int, n: int, repeats: int, log=print) -> list[dict]:
    samples = demo.rollout(prompts, n)
    learners = {name: cls(demo.policy, demo.learner.config) for name, (cls, _) in LEARNER_VARIANTS.items()}
    times: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(repeats + 1):
        for name, learner in learners.items():
            start = time.perf_counter()
            learner.step(samples)
            times[name].append(time.perf_counter() - start)
    base = median_after_warmup(times["engine"], 1)
    rows = []
    for name, learner in learners.items():
        seconds = median_after_warmup(times[name], 1)
        row = {
            "variant": name,
            "what": LEARNER_VARIANTS[name][1],
            "step_s": seconds,
            "slowdown": seconds / base,
            "micro_batches": len(learner.plan(samples)),
        }
        if isinstance(learner, FullSequenceLearner):
            prompt_lengths, responses = groups_of(samples)
            row["padded_tokens"] = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
            row["tokens_through_model"] = full_sequence_count(prompt_lengths, responses).tokens
        else:
            row["padded_tokens"] = padded_tokens(learner, samples)
            prompt_lengths, responses = groups_of(samples)
            row["tokens_through_model"] = shared_prefix_count(prompt_lengths, responses).tokens
        if isinstance(learner, CopiedReferenceLearner):
            row["extra_memory_mib"] = learner.reference_bytes / 2**20
        log(f"  {name:42s} {seconds:.3f} s  ({seconds / base:.2f}x)")
        rows.append(row)
    return rows


def generation_ablation(demo: Demo, prompts: int, n: int, repeats: int, log=print) -> list[dict]:
    """Generation with inference_mode instead of no_grad, with the adapter disabled (the LoRA layers' cost, an
    upper bound on what merging the adapter into the weights for generation could buy), and with each prompt's
    cache copied onto its samples instead of held once."""
    prompt_ids, params = demo.prompts(prompts), demo.params(n)
    model = demo.policy.model
    variants = {
        "engine": contextlib.nullcontext,
        "torch.inference_mode": torch.inference_mode,
        "adapter disabled (no LoRA layers)": model.disable_adapter,
        "prompt cache copied onto every sample": gathered_prompt_cache,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(repeats + 1):
        for name, context in variants.items():
            with context():
                start = time.perf_counter()
                demo.generator.generate(prompt_ids, params, seed=rep)
                times[name].append(time.perf_counter() - start)
    base = median_after_warmup(times["engine"], 1)
    rows = []
    for name in variants:
        seconds = median_after_warmup(times[name], 1)
        log(f"  {name:42s} {seconds:.3f} s  ({seconds / base:.2f}x)")
        rows.append({"variant": name, "generate_s": seconds, "relative": seconds / base})
    return rows


def compaction_ablation(repeats: int, fractions: tuple[float, ...] = (2.0, 0.5, 0.25, 0.125), log=print) -> dict:
    """Dropping ended rows from the decode batch, on a workload whose answers end at very different lengths.

    The demo's answers all end within a few tokens, so this uses a random model of the demo's size whose
    8 end tokens (of 512) make lengths roughly geometric (mean about 55 of at most 128 new tokens), as in
    reasoning rollouts. A fraction of 2 never compacts (the behaviour before).
    """
    import random

    from transformers import Qwen2Config, Qwen2ForCausalLM

    import openrft.rollout.local as local
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.types import SamplingParams

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = Qwen2ForCausalLM(config).eval()
    generator = TransformersGenerator(model, NoText(), eos_token_ids=list(range(1, 9)), pad_token_id=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 512) for _ in range(32)] for _ in range(16)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=128)
    times: dict[float, list[float]] = {f: [] for f in fractions}
    lengths: list[float] = []
    before = local.COMPACT_FRACTION
    try:
        for rep in range(repeats + 1):
            for fraction in fractions:
                local.COMPACT_FRACTION = fraction
                start = time.perf_counter()
                groups = generator.generate(prompts, params, seed=rep)
                times[fraction].append(time.perf_counter() - start)
                lengths.append(statistics.fmean(len(c.token_ids) for g in groups for c in g))
    finally:
        local.COMPACT_FRACTION = before
    base = median_after_warmup(times[fractions[0]], 1)
    rows = []
    for fraction in fractions:
        seconds = median_after_warmup(times[fraction], 1)
        label = "never (before)" if fraction > 1 else f"when {fraction:.0%} of the batch has ended"
        if fraction == before:
            label += " (engine)"
        log(f"  compaction {label:40s} {seconds:.3f} s  ({base / seconds:.2f}x)")
        rows.append({"compaction": label, "generate_s": seconds, "speedup": base / seconds})
    return {
        "rows": rows,
        "mean_length": statistics.fmean(lengths),
        "max_new_tokens": params.max_new_tokens,
        "sequences": len(prompts) * params.n,
    }


def thread_ablation(demo: Demo, prompts: int, n: int, counts: list[int], repeats: int, log=print) -> list[dict]:
    """One rollout and one learner step at each intra-op thread count, interleaved."""
    samples = demo.rollout(prompts, n)
    prompt_ids, params = demo.prompts(prompts), demo.params(n)
    gen: dict[int, list[float]] = {c: [] for c in counts}
    learn: dict[int, list[float]] = {c: [] for c in counts}
    for rep in range(repeats + 1):
        for count in counts:
            with threads(count):
                start = time.perf_counter()
                demo.generator.generate(prompt_ids, params, seed=rep)
                middle = time.perf_counter()
                demo.learner.step(samples)
                gen[count].append(middle - start)
                learn[count].append(time.perf_counter() - middle)
    rows = []
    for count in counts:
        row = {
            "threads": count,
            "generate_s": median_after_warmup(gen[count], 1),
            "learner_step_s": median_after_warmup(learn[count], 1),
        }
        log(f"  {count} threads: generate {row['generate_s']:.3f} s, learner step {row['learner_step_s']:.3f} s")
        rows.append(row)
    return rows


def optimizer_ablation(demo: Demo, repeats: int = 50) -> list[dict]:
    """AdamW's step over the LoRA parameters: torch's default (foreach) against ``fused=True`` (the engine's)."""
    params = demo.policy.trainable_parameters()
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    rows = []
    for name, kwargs in {"foreach (before)": {"foreach": True}, "fused (engine)": {"fused": True}}.items():
        opt = torch.optim.AdamW(params, lr=1e-6, **kwargs)
        opt.step()
        start = time.perf_counter()
        for _ in range(repeats):
            opt.step()
        rows.append({"variant": name, "step_ms": (time.perf_counter() - start) / repeats * 1e3})
    for p in params:
        p.grad = None
    return rows


# OpenMP wait policy: fixed when torch loads, so each setting runs in its own process -------------------

POLICIES = {
    # libgomp's own default when nothing is set: spin 300,000 iterations, then sleep
    "spin (libgomp default)": {"GOMP_SPINCOUNT": "300000"},
    # what importing openrft before torch sets: sleep at once
    "sleep (OpenRFT default)": {"OMP_WAIT_POLICY": "PASSIVE"},
    # a short spin, then sleep (faster decode of a real model on 2 threads; unmeasured under load)
    "short spin": {"GOMP_SPINCOUNT": "20000"},
}


def thread_probe(prompts: int, n: int, count: int, repeats: int) -> dict:
    from benchmarks.demo import demo_spec

    demo = Demo.build(demo_spec(count))
    try:
        rows = thread_ablation(demo, prompts, n, [count], repeats, log=lambda *_: None)
        return {
            **rows[0],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        }
    finally:
        demo.close()


def thread_policy_ablation(prompts: int, n: int, counts: list[int], rounds: int, repeats: int, log=print) -> list[dict]:
    """Generation and learner step for each (wait policy, threads), one process each, ``rounds`` rounds
    interleaved; the median over rounds."""
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(rounds):
        for policy, env in POLICIES.items():
            for count in counts:
                child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
                args = json.dumps({"prompts": prompts, "n": n, "threads": count, "repeats": repeats})
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.optimizations", "--thread-probe", args],
                    cwd=ROOT,
                    env={**child_env, **env},
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"thread probe failed: {out.stderr[-2000:]}")
                results.setdefault((policy, count), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for (policy, count), runs in results.items():
        row = {
            "policy": policy,
            "threads": count,
            "generate_s": statistics.median(r["generate_s"] for r in runs),
            "learner_step_s": statistics.median(r["learner_step_s"] for r in runs),
            "load": load_average(),
        }
        log(
            f"  {policy:24s} {count} threads: generate {row['generate_s']:.3f} s, "
            f"learner step {row['learner_step_s']:.3f} s"
        )
        rows.append(row)
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--thread-probe":
        a = json.loads(sys.argv[2])
        print(json.dumps(thread_probe(a["prompts"], a["n"], a["threads"], a["repeats"])))
    else:
        sys.exit("usage: python -m benchmarks.optimizations --thread-probe JSON (run `python -m benchmarks`)")
