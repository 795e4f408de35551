"""Generation's linear layers on oneDNN (rollout/onednn.py): what torch's linear computes, the same samples, the
layers given back after the call, and torch's own path wherever packing would not pay, fit or serve."""

import pytest
import torch

from openrft import onednn as packing
from openrft.rollout import onednn
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.onednn import fits, packed_linears, usable
from openrft.rollout.types import SamplingParams
from tests.tiny_models import tiny_qwen2

WIDE = dict(hidden_size=256, intermediate_size=512)
"""q/o projections 256 x 256 and the MLP's 512 x 256 reach ``MIN_WEIGHT``; k/v (64 x 256) stay below it."""


def _model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = tiny_qwen2(512, 64, **{**WIDE, **overrides}).eval()
    with torch.no_grad():
        for module in model.modules():  # Qwen2's q projection has a bias: make it count
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_()
    return model


@pytest.fixture
def mkldnn_calls(monkeypatch) -> list[int]:
    """Counts the calls of oneDNN's linear."""
    calls = []
    real = packing.linear

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(packing, "linear", counted)
    return calls


def test_packed_layers_compute_what_torch_does_and_are_given_back(mkldnn_calls):
    model = _model()
    ids = torch.randint(0, 512, (3, 10))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with packed_linears(model, max_new_tokens=8) as count:
            packed = model(input_ids=ids).logits
    # per layer q, o, gate, up, down; the LM head (the embedding is not a Linear)
    assert count == 2 * 5 + 1 and len(mkldnn_calls) == count
    assert torch.allclose(packed, plain, atol=1e-5, rtol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain)
    assert len(mkldnn_calls) == count


def test_generate_samples_the_same_tokens_with_and_without_packing(monkeypatch, mkldnn_calls):
    model = _model()
    gen = TransformersGenerator(model, tokenizer=None, eos_token_ids=[], pad_token_id=0)
    gen.tokenizer = type("Decoder", (), {"decode": staticmethod(lambda ids, **_: "")})()
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8)

    monkeypatch.setattr(onednn, "MIN_NEW_TOKENS", 10**9)
    plain = gen.generate(prompts, params, seed=3)
    assert not mkldnn_calls
    monkeypatch.setattr(onednn, "MIN_NEW_TOKENS", 8)
    packed = gen.generate(prompts, params, seed=3)
    assert mkldnn_calls  # prefill and every decode step
    assert [[c.token_ids for c in g] for g in packed] == [[c.token_ids for c in g] for g in plain]
    for group_p, group_q in zip(packed, plain):
        for p, q in zip(group_p, group_q):
            assert torch.allclose(torch.tensor(p.logprobs), torch.tensor(q.logprobs), atol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_with_gradients_the_layers_compute_on_their_own_weights(mkldnn_calls):
    model = _model().train()
    ids = torch.randint(0, 512, (2, 6))
    model(input_ids=ids).logits.square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with packed_linears(model, max_new_tokens=8):
        model(input_ids=ids).logits.square().mean().backward()
    assert not mkldnn_calls
    assert all(torch.allclose(p.grad, g) for p, g in zip(model.parameters(), plain))


def test_an_input_gradient_through_frozen_weights_uses_torchs_linear(mkldnn_calls):
    """Generation packs no transposes: the input's gradient of a frozen layer is torch's."""
    model = _model().requires_grad_(False)
    embeds = torch.randn(2, 6, 256)

    def input_grad():
        x = embeds.clone().requires_grad_(True)
        model(inputs_embeds=x).logits.square().mean().backward()
        return x.grad

    plain = input_grad()
    with packed_linears(model, max_new_tokens=8):
        assert torch.allclose(input_grad(), plain, atol=1e-6)
    assert not mkldnn_calls


def test_a_weight_changed_during_the_call_is_used_as_it_is_now(mkldnn_calls):
    model = _model()
    ids = torch.randint(0, 512, (2, 6))
    with torch.no_grad(), packed_linears(model, max_new_tokens=8):
        model.lm_head.weight.mul_(2)  # an optimizer step of a learner sharing the model
        packed = model(input_ids=ids).logits
    with torch.no_grad():
        assert torch.allclose(packed, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert len(mkldnn_calls) == 2 * 5  # every layer but the head


def test_a_layer_whose_forward_was_replaced_is_left_alone(mkldnn_calls):
    model = _model()
    own = model.lm_head.forward = lambda x: torch.zeros(*x.shape[:-1], 512)  # as the vocabulary-parallel head does
    with torch.no_grad(), packed_linears(model, max_new_tokens=8) as count:
        assert count == 2 * 5
        assert not model(input_ids=torch.randint(0, 512, (1, 4))).logits.any()
    assert model.lm_head.forward is own


def test_the_layers_are_given_back_when_generation_fails():
    model = _model()
    with pytest.raises(RuntimeError, match="boom"), packed_linears(model, max_new_tokens=8) as count:
        assert count > 0
        raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_nothing_is_packed_where_it_would_not_pay_fit_or_serve(monkeypatch):
    assert usable(_model(), max_new_tokens=8)
    assert usable(_model(), max_new_tokens=7) == []  # too few tokens to repay the copy
    assert usable(_model().to(torch.bfloat16), max_new_tokens=8) == []  # fp32 only
    assert usable(_model(hidden_size=64, intermediate_size=128), max_new_tokens=8) == []  # every weight small
    assert fits(10, 20) and not fits(11, 20)

    class Scarce:
        available = 1 << 20  # 1 MiB free: the 4.7 MB of packed weights would not leave as much again

    monkeypatch.setattr(onednn.psutil, "virtual_memory", lambda: Scarce)
    assert usable(_model(), max_new_tokens=8) == []
