"""Rollout throughput: the engine's generator against a plain ``model.generate`` call on the same prompts.

Both sample from the same model (the LoRA policy, as during training) with the demo's sampling
settings. ``model.generate`` expands every prompt ``n`` times before its prefill
(``num_return_sequences``); the engine prefills each prompt once and gathers its KV cache onto
the ``n`` samples, and also records each token's log-prob. A third column runs the engine's own
decode loop on prompts repeated ``n`` times (no shared prefill), which isolates what sharing buys.
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import median_after_warmup
from benchmarks.demo import Demo
from openrft.rollout.kv import left_pad
from openrft.rollout.types import SamplingParams


def plain_generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    params: SamplingParams,
    pad_token_id: int,
    eos_token_ids: list[int],
    seed: int,
) -> int:
    """``model.generate`` as a trainer without its own generator calls it; returns generated tokens (to EOS)."""
    device = next(model.parameters()).device
    ids, mask, _ = (t.to(device) for t in left_pad(prompts, pad_token_id))
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                max_new_tokens=params.max_new_tokens,
                min_new_tokens=0 if eos_token_ids else params.max_new_tokens,
                num_return_sequences=params.n,
                pad_token_id=pad_token_id,
                eos_token_id=eos_token_ids or None,
            )
    finally:
        model.train(was_training)
    new = out[:, ids.shape[1] :].cpu()
    if not eos_token_ids:
        return new.numel()
    is_end = torch.isin(new, torch.tensor(eos_token_ids))
    ended = is_end.any(dim=1)
    lengths = torch.where(ended, is_end.int().argmax(dim=1) + 1, torch.full_like(ended, new.shape[1], dtype=torch.long))
    return int(lengths.sum())


def model_generate(demo: Demo, prompts: list[list[int]], params: SamplingParams, seed: int) -> int:
    return plain_generate(
        demo.policy.model, prompts, params, demo.parts.tokenizer.pad_token_id, demo.parts.eos_ids, seed
    )


def engine_generate(demo: Demo, prompts: list[list[int]], params: SamplingParams, seed: int) -> int:
    groups = demo.generator.generate(prompts, params, seed=seed)
    return sum(len(c.token_ids) for g in groups for c in g)


def engine_unshared(demo: Demo, prompts: list[list[int]], params: SamplingParams, seed: int) -> int:
    """The engine's decode loop with every prompt repeated ``n`` times and ``n = 1``: one prefill per sample."""
    repeated = [p for p in prompts for _ in range(params.n)]
    single = SamplingParams(
        n=1,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        max_new_tokens=params.max_new_tokens,
    )
    return engine_generate(demo, repeated, single, seed)


SYSTEMS = {"engine": engine_generate, "engine, no shared prefill": engine_unshared, "model.generate": model_generate}


def rollout_throughput(
    demo: Demo,
    prompt_counts: list[int],
    sample_counts: list[int],
    repeats: int,
    max_new_tokens: int | None = None,
    log=print,
) -> list[dict]:
    """Generated tokens/s of each system for every (prompts, samples per prompt), interleaving the systems
    so that load changes fall on all of them; the median of ``repeats`` runs after one warm-up."""
    rows = []
    for prompts_count in prompt_counts:
        for n in sample_counts:
            params = demo.params(n, max_new_tokens)
            prompts = demo.prompts(prompts_count)
            times: dict[str, list[float]] = {name: [] for name in SYSTEMS}
            tokens: dict[str, list[int]] = {name: [] for name in SYSTEMS}
            for rep in range(repeats + 1):
                for name, fn in SYSTEMS.items():
                    start = time.perf_counter()
                    count = fn(demo, prompts, params, seed=rep)
                    times[name].append(time.perf_counter() - start)
                    tokens[name].append(count)
            row = {"prompts": prompts_count, "samples_per_prompt": n, "sequences": prompts_count * n}
            for name in SYSTEMS:
                seconds = median_after_warmup(times[name], 1)
                mean_tokens = sum(tokens[name][1:]) / repeats
                row[f"{name} s"] = seconds
                row[f"{name} tok/s"] = mean_tokens / seconds
            row["speedup vs model.generate"] = row["engine tok/s"] / row["model.generate tok/s"]
            row["speedup from shared prefill"] = row["engine tok/s"] / row["engine, no shared prefill tok/s"]
            log(
                f"  {prompts_count:4d} prompts x {n:2d}: engine {row['engine tok/s']:8.0f} tok/s, model.generate "
                f"{row['model.generate tok/s']:8.0f} tok/s ({row['speedup vs model.generate']:.2f}x), "
                f"no shared prefill {row['engine, no shared prefill tok/s']:8.0f} tok/s"
            )
            rows.append(row)
    return rows
