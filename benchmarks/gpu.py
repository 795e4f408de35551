"""The engine on one NVIDIA GPU: a randomly initialised Qwen2-0.5B- or Qwen2-1.5B-shaped model (built from
a config, nothing downloaded), in bf16. Reports generation tokens/s (the engine's generator and plain
``model.generate``), learner tokens/s, and the learner's achieved FLOP/s against the GPU's bf16
peak, both the measured matmul peak and the vendor's dense figure where the GPU is known.

    python -m benchmarks gpu [--shape 0.5b|1.5b] [--prompts 32] [--samples 8] [--prompt-tokens 128]
        [--new-tokens 256] [--json FILE]

Without a CUDA device it says so and exits 0 (CI never needs it). ``--allow-cpu --tiny`` runs the
same code on the CPU with a tiny model, to check the code path. ``--json FILE`` appends the result as
one JSON line (``scripts/gpu_check.sh`` collects both shapes that way).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from benchmarks.common import NoText, matmul_flops, sync, write_results
from benchmarks.rollout import plain_generate
from openrft.learner.flops import DecoderShape, learner_step_flops

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, FLOP/s, by a part of the name
# torch reports (the longest match wins: "H100 PCIe" before "H100", "L40S" before "L4"). The SXM H100
# reports itself as "H100 80GB HBM3".
BF16_PEAK = {
    "H200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}

SKIP_MESSAGE = "no CUDA device: the GPU benchmark needs an NVIDIA GPU (--allow-cpu --tiny checks the code path on CPU)"


# The published Qwen2 shapes measured here (tied embeddings, rope theta 1e6, RMS eps 1e-6 for both).
SHAPES = {
    "0.5b": {
        "label": "Qwen2-0.5B",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "1.5b": {
        "label": "Qwen2-1.5B",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
}


def qwen2_config(shape: str = "0.5b", tiny: bool = False):
    """A Qwen2 shape of ``SHAPES`` (vocabulary 151,936, tied embeddings); ``tiny`` keeps the structure at a size a
    CPU runs in seconds, whatever the shape."""
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            eos_token_id=None,
            bos_token_id=None,
            pad_token_id=0,
        )
    dims = {k: v for k, v in SHAPES[shape].items() if k != "label"}
    return Qwen2Config(
        vocab_size=151936,
        **dims,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )


def qwen2_05b_config(tiny: bool = False):
    """Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocab 151,936, tied
    embeddings); ``tiny`` keeps the structure at a size a CPU runs in seconds."""
    return qwen2_config("0.5b", tiny)


def nominal_peak(device_name: str) -> float | None:
    """The data-sheet bf16 peak of a GPU from its name (longest matching key first), or None if unknown."""
    for key in sorted(BF16_PEAK, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return BF16_PEAK[key]
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b", help="the Qwen2 shape (default 0.5b)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens generated per sample (no early stop)")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="measured learner steps (after one warm-up)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU")
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same structure")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    parser.add_argument("--json", metavar="FILE", help="also append the result to FILE as one JSON line")
    args = parser.parse_args(argv)
    for name in ("prompts", "samples", "prompt_tokens", "new_tokens", "micro_batch_tokens", "lora_rank", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def pick_device(allow_cpu: bool) -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu") if allow_cpu else None


def run(args: argparse.Namespace, device: torch.device) -> dict:
    from transformers import Qwen2ForCausalLM

    from openrft.learner import Learner, LearnerConfig, Policy, TrainSample
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.types import SamplingParams
    from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = qwen2_config(args.shape, args.tiny)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: no 2 GB detour through host memory
        model = Qwen2ForCausalLM(config).to(dtype=dtype)
    params_count = sum(p.numel() for p in model.parameters())
    lora = LoraSpec(rank=args.lora_rank, alpha=2 * args.lora_rank)
    algorithm = AlgorithmSpec(kl_loss_coef=0.001, clip_ratio_high=0.28)
    policy = Policy(model, lora, need_reference=True)
    learner = Learner(
        policy,
        LearnerConfig(
            algorithm,
            OptimizerSpec(lr=1e-5),
            lora,
            temperature=1.0,
            micro_batch_tokens=args.micro_batch_tokens,
            pad_token_id=0,
        ),
    )
    generator = TransformersGenerator(
        policy.model,
        tokenizer=NoText(),
        eos_token_ids=[],
        pad_token_id=0,
        seed=0,
        max_batch_sequences=args.prompts * args.samples,
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(1, config.vocab_size) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    sampling = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.new_tokens)

    def timed(fn):
        sync(device)
        start = time.perf_counter()
        value = fn()
        sync(device)
        return time.perf_counter() - start, value

    timed(lambda: generator.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=4)))  # warm-up
    gen_s, groups = timed(lambda: generator.generate(prompts, sampling))
    generated = sum(len(c.token_ids) for g in groups for c in g)
    plain_s, plain_tokens = timed(lambda: plain_generate(policy.model, prompts, sampling, 0, [], seed=0))

    samples = [TrainSample(c.prompt_ids, c.token_ids, 1.0 if j % 2 else -1.0) for g in groups for j, c in enumerate(g)]
    times = []
    for _ in range(args.steps + 1):
        seconds, _ = timed(lambda: learner.step(samples))
        times.append(seconds)
    step_s = sorted(times[1:])[len(times[1:]) // 2]
    shape = DecoderShape.from_config(config)
    flops = learner_step_flops(shape, samples, args.lora_rank, reference=True)
    measured_peak = matmul_flops(device, dtype, 8192 if device.type == "cuda" else 512)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    nominal = nominal_peak(device_name) if device.type == "cuda" else None
    achieved = flops / step_s
    trained = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    result = {
        "device": device_name,
        "dtype": str(dtype),
        "shape": args.shape,
        "model": f"{SHAPES[args.shape]['label']} shape, random weights"
        if not args.tiny
        else f"tiny Qwen2 (code-path check of --shape {args.shape})",
        "parameters": params_count,
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "generate_s": gen_s,
        "generated_tokens": generated,
        "engine_generate_tokens_per_s": generated / gen_s,
        "model_generate_s": plain_s,
        "model_generate_tokens_per_s": plain_tokens / plain_s,
        "learner_step_s": step_s,
        "learner_step_times": times,
        "learner_sequence_tokens_per_s": trained / step_s,
        "learner_response_tokens_per_s": sum(len(s.response_ids) for s in samples) / step_s,
        "learner_model_flops": flops,
        "achieved_flops_per_s": achieved,
        "measured_matmul_peak_flops_per_s": measured_peak,
        "fraction_of_measured_peak": achieved / measured_peak,
        "nominal_bf16_peak_flops_per_s": nominal,
        "fraction_of_nominal_peak": achieved / nominal if nominal else None,
        "max_memory_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    return result


def json_line(result: dict, argv: list[str] | None) -> str:
    """The result as one JSON line, with the command, the time and the versions it ran with."""
    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    args = sys.argv[1:] if argv is None else ["gpu", *argv]
    header = {
        "benchmark": "gpu",
        "command": "python -m benchmarks " + " ".join(args),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "versions": versions,
    }
    return json.dumps({**header, **result}, default=str)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.allow_cpu)
    if device is None:
        print(SKIP_MESSAGE)
        return 0
    result = run(args, device)
    for key, value in result.items():
        if key != "learner_step_times":
            print(f"  {key}: {value}")
    if args.json:
        with Path(args.json).open("a") as f:
            f.write(json_line(result, argv) + "\n")
        print(f"appended to {args.json}")
    if not args.no_write:
        r = result
        share = r["fraction_of_nominal_peak"]
        nominal = f", {share:.1%} of the data-sheet peak" if share else ""
        lines = [
            f"{r['model']}, {r['parameters'] / 1e6:.0f}M parameters, {r['dtype']} on {r['device']}; {args.prompts} "
            f"prompts x {args.samples} samples, {args.prompt_tokens} prompt tokens, {args.new_tokens} new tokens each.",
            "",
            f"- generation: engine {r['engine_generate_tokens_per_s']:.0f} tok/s, plain model.generate "
            f"{r['model_generate_tokens_per_s']:.0f} tok/s",
            f"- learner: {r['learner_step_s']:.2f} s per step, "
            f"{r['learner_sequence_tokens_per_s']:.0f} sequence tokens/s",
            f"- achieved {r['achieved_flops_per_s'] / 1e12:.1f} TFLOP/s: {r['fraction_of_measured_peak']:.1%} of the "
            f"measured bf16 matmul peak ({r['measured_matmul_peak_flops_per_s'] / 1e12:.0f} TFLOP/s){nominal}",
        ]
        name = "gpu" if args.shape == "0.5b" else f"gpu-{args.shape}"
        path = write_results(name, f"GPU benchmark ({SHAPES[args.shape]['label']} shape)", lines, result)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
