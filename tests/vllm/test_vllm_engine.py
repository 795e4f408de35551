"""OpenRFT's generation client against a real vLLM server: adapters, log-prob parity with the learner,
the server's log-prob density, full-rank weights."""

from __future__ import annotations

import httpx
import pytest
import torch

from openrft.algo.rollout_correction import support_log_probs
from openrft.learner.batch import TrainSample, collate
from openrft.models import load_tokenizer
from openrft.rollout.remote import RemoteGenerator
from openrft.rollout.types import SamplingParams
from openrft.spec.dialects import load_job
from tests.core.test_data_parallel import _learner
from tests.vllm.conftest import vllm_recipe

PROMPTS = [load_tokenizer("openrft-demo").encode(text) for text in ("12+7=", "40+23=")]


def _spec(tmp_path, url, **lora):
    spec = load_job(vllm_recipe(tmp_path, url))
    spec.lora.rank = 8
    for name, value in lora.items():
        setattr(spec.lora, name, value)
    return spec


def _trained_learner(spec):
    """A learner whose LoRA adapter is random (not the zero init): the adapter visibly changes the model."""
    learner = _learner(spec)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in learner.policy.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return learner


def _generator(url, spec, tmp_path, name="t") -> RemoteGenerator:
    tokenizer = load_tokenizer("openrft-demo")
    return RemoteGenerator(
        url,
        adapter_dir=tmp_path / "adapters",
        lora=spec.lora,
        base_model=str(spec.model.name_or_path),
        eos_token_ids=[tokenizer.eos_token_id],
        adapter_prefix=name,
    )


def _served(url) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}


def _learner_logp(learner, completions, top_k=0, top_p=1.0):
    samples = [TrainSample(c.prompt_ids, c.token_ids, advantage=0.0) for c in completions]
    mb = collate(samples, 0, torch.device("cpu"))
    learner.model.eval()
    with torch.no_grad():
        logits = learner.logits(learner.model, mb)
        if top_k or top_p < 1.0:
            logp = support_log_probs(logits, mb.targets, top_k, top_p)
        else:
            logp = torch.log_softmax(logits, -1).gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    return [logp[i, : len(c.token_ids)] for i, c in enumerate(completions)]


def test_adapters_are_loaded_by_version_and_the_old_one_unloaded(vllm_server, tmp_path):
    spec = _spec(tmp_path, vllm_server)
    learner = _trained_learner(spec)
    generator = _generator(vllm_server, spec, tmp_path, "lora-test")
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    base = generator.generate(PROMPTS, params)
    generator.load_adapter(learner.policy.adapter_state(), 1)
    assert "lora-test-v1" in _served(vllm_server)
    tuned = generator.generate(PROMPTS, params)
    assert [g[0].token_ids for g in tuned] != [g[0].token_ids for g in base]  # the adapter is in use
    assert all(g[0].policy_version == 1 for g in tuned)
    generator.load_adapter(learner.policy.adapter_state(), 2)
    served = _served(vllm_server)
    assert "lora-test-v2" in served and "lora-test-v1" not in served
    assert not (tmp_path / "adapters" / "lora-test-v1").exists()
    httpx.post(f"{vllm_server}/v1/unload_lora_adapter", json={"lora_name": "lora-test-v2"}, timeout=30)


def test_the_server_reports_the_processed_density(vllm_server, tmp_path):
    generator = _generator(vllm_server, _spec(tmp_path, vllm_server), tmp_path)
    assert generator.probe_logprob_mode(PROMPTS[0]) == "processed"


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 0.9)])
def test_log_probs_match_the_learner_at_the_same_weights(vllm_server, tmp_path, top_k, top_p):
    spec = _spec(tmp_path, vllm_server)
    learner = _trained_learner(spec)
    generator = _generator(vllm_server, spec, tmp_path, f"parity-{top_k}")
    generator.load_adapter(learner.policy.adapter_state(), 1)
    params = SamplingParams(n=4, temperature=0.7, top_k=top_k, top_p=top_p, max_new_tokens=8)
    completions = [c for group in generator.generate(PROMPTS, params, seed=3) for c in group]
    assert all(c.logprobs_truncated == (top_k > 0) for c in completions)
    learner.config.temperature = 0.7
    ours = _learner_logp(learner, completions, top_k, top_p)
    gap = max((o - torch.tensor(c.logprobs)).abs().max().item() for o, c in zip(ours, completions))
    assert gap < 1e-4
    httpx.post(f"{vllm_server}/v1/unload_lora_adapter", json={"lora_name": f"parity-{top_k}-v1"}, timeout=30)


def test_full_rank_weights_reach_the_server_and_the_next_sample(vllm_server, tmp_path):
    from transformers import AutoModelForCausalLM

    from openrft.models import resolve_model_path

    spec = _spec(tmp_path, vllm_server, enabled=False)
    generator = _generator(vllm_server, spec, tmp_path, "full")
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("openrft-demo"), torch_dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    before = [g[0].token_ids for g in generator.generate(PROMPTS, params)]
    changed = dict(original)
    changed["model.norm.weight"] = -original["model.norm.weight"]  # every logit negated: argmax -> argmin
    try:
        generator.load_adapter(changed, 1)
        after = generator.generate(PROMPTS, params)
        model.load_state_dict(changed)
        expected = []
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
            expected.append(out[0, len(prompt) :].tolist())
        assert [g[0].token_ids for g in after] != before
        assert [g[0].token_ids for g in after] == [e[: len(g[0].token_ids)] for g, e in zip(after, expected)]
        assert all(g[0].policy_version == 1 for g in after)
    finally:
        generator.load_adapter(original, 2)  # the shared server serves the demo model again
    assert [g[0].token_ids for g in generator.generate(PROMPTS, params)] == before
