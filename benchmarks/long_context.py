"""Long responses at a real vocabulary: one learner step and one generation per response length.

The model is Qwen2-shaped with Qwen2.5's vocabulary (151,936 tokens), narrow (hidden size 64, 2 layers) and
randomly initialised from a config: nothing is downloaded, and the vocabulary, not the layers, dominates
what a long response costs. The step is the engine's own ``Learner.step`` (LoRA, the KL's reference forward,
AdamW) on one response of ``tokens`` tokens after a 32-token prompt; "unchunked" is the same step with the
full fp32 logits and transformers' plain SDPA attention, as before the chunked LM head (learner/logprobs.py)
and the chunked attention (attention.py). Each measurement runs in a fresh process: freed memory is handed
back (``malloc_trim``) and the kernel's resident high-water mark reset (``/proc/self/clear_refs``) just
before it, so the peak above the baseline (model, optimizer state, runtime) is what the step itself needs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from benchmarks.common import ROOT, NoText
from benchmarks.learner import _release_free_memory, _reset_peak, _resident_kib

VOCAB = 151_936
PROMPT_TOKENS = 32


def build_model(max_tokens: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_tokens + PROMPT_TOKENS + 1,
        tie_word_embeddings=True,  # as Qwen2.5's small models
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def build_learner(model: torch.nn.Module, chunked: bool):
    from openrft.attention import use_chunked_sdpa
    from openrft.learner import Learner, Policy
    from openrft.learner.learner import LearnerConfig
    from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec

    if chunked:
        use_chunked_sdpa(model)
    lora = LoraSpec(rank=16, alpha=32)
    policy = Policy(model, lora, need_reference=True)
    config = LearnerConfig(
        AlgorithmSpec(kl_loss_coef=0.001),
        OptimizerSpec(lr=1e-4),
        lora,
        temperature=1.0,
        micro_batch_tokens=1 << 30,
        pad_token_id=0,
    )
    if not chunked:
        config.logits_chunk_bytes = 1 << 62  # the full logits, always
    return Learner(policy, config)


def sample(tokens: int):
    from openrft.learner.batch import TrainSample

    g = torch.Generator().manual_seed(tokens)
    prompt = torch.randint(1, VOCAB, (PROMPT_TOKENS,), generator=g).tolist()
    return TrainSample(prompt, torch.randint(1, VOCAB, (tokens,), generator=g).tolist(), advantage=1.0)


def probe(kind: str, tokens: int, threads: int) -> dict:
    """One measurement (``train``, ``train-unchunked`` or ``generate``) in this process."""
    torch.set_num_threads(threads)
    model = build_model(tokens)
    if kind == "generate":
        from openrft.attention import use_chunked_sdpa
        from openrft.rollout.local import TransformersGenerator
        from openrft.rollout.types import SamplingParams

        use_chunked_sdpa(model)
        generator = TransformersGenerator(model, NoText(), eos_token_ids=[], pad_token_id=0, seed=0)
        generator._version = 0
        prompt = sample(1).prompt_ids

        def run(n: int) -> int:
            params = SamplingParams(n=1, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n)
            return len(generator.generate([prompt], params)[0][0].token_ids)

    else:
        learner = build_learner(model, chunked=kind == "train")

        def run(n: int) -> int:
            learner.step([sample(n)])
            return n

    run(64)  # warm-up: lazy allocations, optimizer state
    _release_free_memory()
    baseline, _ = _resident_kib()
    exact = _reset_peak()
    start = time.perf_counter()
    produced = run(tokens)
    seconds = time.perf_counter() - start
    _, peak = _resident_kib()
    return {
        "kind": kind,
        "tokens": produced,
        "seconds": seconds,
        "peak_mib_above_model": (peak - baseline) / 1024,
        "baseline_mib": baseline / 1024,
        "exact_peak": exact,
    }


def probe_in_subprocess(kind: str, tokens: int, threads: int, timeout: float) -> dict:
    args = json.dumps({"kind": kind, "tokens": tokens, "threads": threads})
    try:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.long_context", "--probe", args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"kind": kind, "tokens": tokens, "error": f"over {timeout:.0f} s"}
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        return {"kind": kind, "tokens": tokens, "error": tail[0][-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def long_context(
    train_tokens: list[int],
    unchunked_tokens: list[int],
    generate_tokens: list[int],
    threads: int,
    timeout: float,
    log=print,
) -> list[dict]:
    """One row per length: the chunked step (``peak_mib_above_model``, ``step_s``), the unchunked step where
    asked, and generation where asked. Each row is printed as one JSON line as soon as it is complete."""
    rows = []
    for tokens in sorted(set(train_tokens) | set(unchunked_tokens) | set(generate_tokens)):
        row: dict = {"tokens": tokens}
        if tokens in train_tokens:
            r = probe_in_subprocess("train", tokens, threads, timeout)
            row.update(peak_mib_above_model=r.get("peak_mib_above_model"), step_s=r.get("seconds"))
            row["error"] = r.get("error")
        if tokens in unchunked_tokens:
            r = probe_in_subprocess("train-unchunked", tokens, threads, timeout)
            row.update(unchunked_peak_mib_above_model=r.get("peak_mib_above_model"), unchunked_step_s=r.get("seconds"))
            row["unchunked_error"] = r.get("error")
            if row.get("step_s") and row.get("unchunked_step_s"):
                row["chunked_over_unchunked_time"] = row["step_s"] / row["unchunked_step_s"]
        if tokens in generate_tokens:
            r = probe_in_subprocess("generate", tokens, threads, timeout)
            row.update(generate_s=r.get("seconds"), generate_peak_mib_above_model=r.get("peak_mib_above_model"))
            row["generate_error"] = r.get("error")
            if r.get("seconds"):
                row["generate_ms_per_token"] = 1000 * r["seconds"] / r["tokens"]
        row = {k: v for k, v in row.items() if v is not None}
        log(json.dumps(row))
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", required=True)
    spec = json.loads(parser.parse_args(argv).probe)
    from openrft.cli import quiet_libraries

    quiet_libraries()
    print(json.dumps(probe(spec["kind"], spec["tokens"], spec["threads"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
