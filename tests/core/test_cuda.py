"""The engine on an NVIDIA GPU: its device and dtype choice, its generator's recorded log-probs against the
learner's, a learner step, a short job, and the GPU benchmark's code path at a small size. Marked ``cuda`` and
skipped without a CUDA device, so CI only collects them; ``scripts/gpu_check.sh`` runs them on a GPU machine
(``pytest -m cuda``)."""

import json
import math

import pytest
import torch
import yaml

from openrft.learner import Learner, LearnerConfig, Policy, TrainSample
from openrft.learner.batch import collate
from openrft.learner.learner import response_logits, token_logp
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer, pick_device, pick_dtype
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import SamplingParams
from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh runs it)"),
]

QUESTIONS = ("What is 12+7?", "What is 99-45?", "What is 3+4?", "What is 8*8?", "What is 10-1?")


def _generator(dtype: torch.dtype, model=None):
    tokenizer = load_tokenizer("openrft-demo")
    model = model if model is not None else load_causal_lm("openrft-demo", torch.device("cuda"), dtype)
    gen = TransformersGenerator(model, tokenizer, eos_token_ids(tokenizer, model), tokenizer.pad_token_id, seed=1)
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return tokenizer, model, gen, prompts


def test_auto_picks_the_gpu_in_bf16():
    device = pick_device("auto")
    assert device.type == "cuda"
    assert pick_dtype("auto", device) == torch.bfloat16


# bf16's 8-bit mantissa: the cached decode and the learner's full forward round differently
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 2e-3), (torch.bfloat16, 0.25)])
def test_generator_logprobs_match_the_learner_on_gpu(dtype, tolerance):
    tokenizer, model, gen, prompts = _generator(dtype)
    groups = gen.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
    assert [[c.prompt_ids for c in g] for g in groups] == [[p] * 4 for p in prompts]
    completions = [c for g in groups for c in g if c.token_ids]
    assert completions
    samples = [TrainSample(c.prompt_ids, c.token_ids, 0.0) for c in completions]
    mb = collate(samples, tokenizer.pad_token_id, torch.device("cuda"))
    with torch.no_grad():
        logp = token_logp(response_logits(model, mb, 1.0), mb.targets).float().cpu()
    worst = 0.0
    for i, c in enumerate(completions):
        n = len(c.token_ids)
        worst = max(worst, (logp[i, :n] - torch.tensor(c.logprobs)).abs().max().item())
    assert worst < tolerance, f"largest log-prob difference {worst:.4g} at {dtype}"


def test_learner_step_on_gpu_moves_the_adapter():
    model = load_causal_lm("openrft-demo", torch.device("cuda"), torch.bfloat16)
    lora = LoraSpec(rank=4, alpha=8)
    policy = Policy(model, lora, need_reference=True)
    tokenizer, _, gen, prompts = _generator(torch.bfloat16, policy.model)
    config = LearnerConfig(
        AlgorithmSpec(kl_loss_coef=0.001),
        OptimizerSpec(lr=1e-3),
        lora,
        temperature=1.0,
        micro_batch_tokens=4096,
        pad_token_id=tokenizer.pad_token_id,
    )
    learner = Learner(policy, config)
    groups = gen.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
    samples = [
        TrainSample(c.prompt_ids, c.token_ids, 1.0 if j % 2 else -1.0)
        for g in groups
        for j, c in enumerate(g)
        if c.token_ids
    ]
    trained = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trained and all(p.device.type == "cuda" for p in trained.values())
    before = {n: p.detach().clone() for n, p in trained.items()}
    metrics = learner.step(samples)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in trained.items())
    assert learner.version == 1


def test_short_job_trains_on_the_gpu(recipe_factory, tmp_path):
    from openrft.engine import RFTJob
    from openrft.spec.dialects import load_job

    path = recipe_factory(max_steps=2)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["device"] = "cuda"
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    assert spec.runtime.device == "cuda"
    run_dir = tmp_path / "run"
    summary = RFTJob(spec, run_dir, show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"])
        assert row["perf/max_memory_allocated_gb"] > 0  # the policy lives on the GPU
    assert (run_dir / "adapter").is_dir()


def test_gpu_benchmark_code_path_at_a_small_size():
    from benchmarks import gpu

    args = gpu.parse_args(
        ["--tiny", "--prompts", "2", "--samples", "2", "--prompt-tokens", "6", "--new-tokens", "3", "--steps", "1"]
    )
    result = gpu.run(args, torch.device("cuda"))
    assert result["dtype"] == "torch.bfloat16" and result["generated_tokens"] == 2 * 2 * 3
    assert result["learner_model_flops"] > 0 and result["max_memory_allocated_gib"] > 0
