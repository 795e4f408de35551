"""Micro-batches are capped at what fits in the memory the learner has; the gradient does not change."""

import pytest
import torch
from transformers import Qwen2Config

import openrft.learner.learner as learner_module
from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.learner.activation_memory import MIN_TOKENS, activation_bytes_per_token, micro_batch_cap
from openrft.learner.batch import TrainSample
from openrft.models import load_causal_lm, load_tokenizer
from openrft.spec.dialects import load_job

MiB = 2**20


def test_estimate_per_token_on_a_real_shape():
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24)
    per_token = activation_bytes_per_token(config, 4, checkpointing=False)
    assert per_token == (10 * 896 + 5 * 4864) * 24 * 4  # 3.05 MiB: above the 2.4 MiB measured on this shape
    assert 2.4 * MiB < per_token < 3.5 * MiB
    checkpointed = activation_bytes_per_token(config, 4, checkpointing=True)
    assert checkpointed == (896 * 24 + 10 * 896 + 5 * 4864) * 4
    assert activation_bytes_per_token(config, 2, checkpointing=False) == per_token // 2  # bf16 activations


def test_cap_is_half_the_available_memory_split_between_sharers():
    assert micro_batch_cap(3 * MiB, 24 * 1024 * MiB) == 4096  # 12 GiB / 3 MiB
    assert micro_batch_cap(3 * MiB, 24 * 1024 * MiB, sharers=4) == 1024
    assert micro_batch_cap(3 * MiB, 100 * MiB) == MIN_TOKENS  # never below the floor


def _learner(spec) -> Learner:
    torch.manual_seed(0)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float64)
    policy = Policy(model, spec.lora, need_reference=False)
    with torch.no_grad():  # LoRA starts at B = 0: move the policy off the base so every parameter gets a gradient
        for param in policy.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return Learner(policy, learner_config(spec, load_tokenizer("openrft-demo").pad_token_id))


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(6):
        prompt_ids = torch.randint(5, 60, (20,), generator=g).tolist()
        for k in range(8):
            response = torch.randint(5, 60, (60,), generator=g).tolist()
            samples.append(TrainSample(prompt_ids, response, advantage=float(k) - 3.5))
    return samples


def test_learner_splits_a_batch_that_would_not_fit_and_computes_the_same_gradient(recipe_factory, monkeypatch):
    spec = load_job(recipe_factory(max_steps=1))
    samples = _samples()  # 6 groups of 20 + 8 x 60 = 500 tokens
    total = sum(len(s.response_ids) for s in samples)

    roomy = _learner(spec)
    assert roomy.micro_batch_cap > spec.training.micro_batch_tokens  # the demo model: 8,192 tokens fit easily
    assert len(roomy.plan(samples)) == 1
    roomy.accumulate(samples, total)
    expected = torch.cat([g.flatten() for g in roomy.gradients()])

    per_token = roomy.activation_bytes_per_token
    monkeypatch.setattr(learner_module, "available_bytes", lambda device: 2 * 1000 * per_token)  # room for 1,000
    tight = _learner(spec)
    assert tight.micro_batch_cap == 1000
    plan = tight.plan(samples)
    assert len(plan) == 3 and sorted(i for mb in plan for i in mb) == list(range(len(samples)))
    tight.accumulate(samples, total)
    got = torch.cat([g.flatten() for g in tight.gradients()])
    assert expected.norm() > 0
    assert (got - expected).norm() <= 1e-10 * expected.norm()


@pytest.mark.parametrize("capped", [True, False])
def test_job_says_when_it_caps_micro_batches(recipe_factory, monkeypatch, tmp_path, capped):
    from openrft.engine import RFTJob

    spec = load_job(recipe_factory(max_steps=1))
    events = []
    job = RFTJob(spec, tmp_path, show_progress=False, on_event=lambda _level, message: events.append(message))
    if capped:
        monkeypatch.setattr(learner_module, "available_bytes", lambda device: 100 * MiB)  # ~1,000 demo tokens
    job._build()
    job.rollouts.close(), job.rewards.close()
    notes = [m for m in events if "micro-batches hold at most" in m]
    if capped:
        assert len(notes) == 1 and "training.micro_batch_tokens 8,192" in notes[0], events
        assert job.learner.micro_batch_cap < 8192
    else:
        assert notes == []
