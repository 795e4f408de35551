"""The learner's frozen base weights on oneDNN (learner/onednn.py, openrft/onednn.py): the same gradients and loss
sums as torch's linear, the input's gradient through the packed transpose, the layers given back after the pass, and
torch's own path wherever packing would not pay, fit or serve."""

import pytest
import torch

from openrft import onednn
from openrft.learner import onednn as learner_onednn
from openrft.learner.batch import collate
from openrft.learner.learner import Learner, LearnerConfig
from openrft.learner.logprobs import unwrap
from openrft.learner.policy import Policy
from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec
from tests.tiny_models import grouped_samples, tiny_qwen2

VOCAB = 512
WIDE = dict(hidden_size=256, intermediate_size=512)
"""q/o projections 256 x 256 and the MLP's 512 x 256 reach ``MIN_WEIGHT``; k/v (64 x 256) stay below it."""
PACKED_PER_LAYER = 5  # q, o, gate, up, down


def _learner(lora: LoraSpec | None = None, kl: float = 0.05, checkpointing: bool = False) -> Learner:
    lora = lora or LoraSpec()
    torch.manual_seed(0)
    model = tiny_qwen2(VOCAB, 128, **WIDE)
    with torch.no_grad():  # Qwen2's q/k/v projections have a bias: make it count
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_()
    policy = Policy(model, lora, need_reference=kl > 0)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA starts at B = 0, the policy equal to the reference: move it off
        for param in policy.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    config = LearnerConfig(
        AlgorithmSpec(kl_loss_coef=kl),
        OptimizerSpec(),
        lora,
        temperature=0.7,
        micro_batch_tokens=60,
        pad_token_id=0,
        activation_checkpointing=checkpointing,
    )
    return Learner(policy, config)


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """Counts oneDNN's linear calls, those made for a layer input's gradient, and the LM head's products."""
    counts = {"linear": 0, "input_grad": 0, "head": 0}
    real_linear, real_backward = onednn.linear, onednn._FrozenLinear.backward
    real_times, real_times_transpose = onednn.times, onednn.times_transpose

    def linear(*args):
        counts["linear"] += 1
        return real_linear(*args)

    def backward(ctx, grad):
        counts["input_grad"] += 1
        return real_backward(ctx, grad)

    def head(real):
        def counted(*args):
            out = real(*args)
            counts["head"] += out is not None
            return out

        return counted

    monkeypatch.setattr(onednn, "linear", linear)
    monkeypatch.setattr(onednn._FrozenLinear, "backward", staticmethod(backward))
    monkeypatch.setattr(onednn, "times", head(real_times))
    monkeypatch.setattr(onednn, "times_transpose", head(real_times_transpose))
    return counts


def _relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    num = sum(float((g - w).square().sum()) for g, w in zip(got, want))
    return (num / sum(float(w.square().sum()) for w in want)) ** 0.5


@pytest.mark.parametrize("kl", [0.0, 0.05])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_gradient_on_packed_weights_is_torchs(monkeypatch, calls, kl, checkpointing):
    learner = _learner(kl=kl, checkpointing=checkpointing)
    samples = grouped_samples(VOCAB)
    total = sum(len(s.response_ids) for s in samples)

    monkeypatch.setattr(learner_onednn, "MIN_TOKENS", 10**9)
    want_sums = learner.accumulate(samples, total)
    want = learner.gradients()
    learner.optimizer.zero_grad(set_to_none=True)
    assert calls == {"linear": 0, "input_grad": 0, "head": 0}

    monkeypatch.setattr(learner_onednn, "MIN_TOKENS", 1)
    learner.config.logits_chunk_bytes = 4 * VOCAB * 5  # the head chunked, 5 tokens at a time
    got_sums = learner.accumulate(samples, total)
    assert _relative_error(learner.gradients(), want) <= 1e-5
    for key in ("pg_loss", "kl"):
        assert got_sums[key] == pytest.approx(want_sums[key], rel=1e-5, abs=1e-7)
    # every micro-batch's forward ran its packed layers, and backward took their input's gradient through the
    # packed transpose (all but layer 0's q projection, whose input needs no gradient)
    micro_batches = len(learner.plan(samples))
    assert calls["input_grad"] >= micro_batches * (2 * PACKED_PER_LAYER - 1)
    assert calls["linear"] >= calls["input_grad"] + micro_batches * 2 * PACKED_PER_LAYER + calls["head"]
    # the head's logits per chunk, and each chunk's d logp / dh for the policy (the reference's without it)
    tokens = [collate([samples[i] for i in mb], 0, torch.device("cpu")).targets.numel() for mb in learner.plan(samples)]
    chunks = sum(-(-n // 5) for n in tokens)
    assert calls["head"] == (3 if kl else 2) * chunks
    assert not any("forward" in m.__dict__ for m in learner.model.modules())


def test_the_frozen_layers_and_head_are_packed_not_trained_weights():
    lora = _learner()
    layers = learner_onednn.decoder_layers(lora.model)
    assert len(layers) == 2 * PACKED_PER_LAYER
    head = unwrap(lora.model).get_output_embeddings()
    assert head not in layers and learner_onednn.head_weights(lora.model) == [head.weight]
    assert all(not m.weight.requires_grad for m in layers)
    full = _learner(LoraSpec(enabled=False), kl=0.0)  # full fine-tuning: every weight trains
    assert learner_onednn.decoder_layers(full.model) == [] and learner_onednn.head_weights(full.model) == []


def test_the_layers_are_given_back_when_a_pass_fails(monkeypatch):
    learner = _learner()
    monkeypatch.setattr(learner_onednn, "MIN_TOKENS", 1)

    def fail(loss):
        assert any("forward" in m.__dict__ for m in learner.model.modules())  # packed while it ran
        raise RuntimeError("boom")

    monkeypatch.setattr(learner, "backward", fail)
    samples = grouped_samples(VOCAB)
    with pytest.raises(RuntimeError, match="boom"):
        learner.accumulate(samples, 100)
    assert not any("forward" in m.__dict__ for m in learner.model.modules())


def test_nothing_is_packed_where_it_would_not_pay_or_fit(monkeypatch):
    model = _learner().model
    weights = [m.weight for m in learner_onednn.decoder_layers(model)] + learner_onednn.head_weights(model)
    size = onednn.packed_bytes(weights, with_transpose=True)

    def packed(tokens: int, activation_bytes: int) -> int:
        with learner_onednn.frozen_linears(model, tokens, activation_bytes) as count:
            return count

    assert packed(512, 0) == 2 * PACKED_PER_LAYER + 1
    assert packed(511, 0) == 0  # too few tokens to repay the copies
    assert learner_onednn.fits(10, 5, 25) and not learner_onednn.fits(10, 6, 25)

    class Scarce:
        available = 2 * size + 1000  # the copies and as much again, but not the micro-batch's activations too

    monkeypatch.setattr(learner_onednn.psutil, "virtual_memory", lambda: Scarce)
    assert packed(512, 999) == 2 * PACKED_PER_LAYER + 1
    assert packed(512, 1001) == 0


def test_a_packed_matrix_serves_only_its_own_weight_as_packed_and_only_inside():
    torch.manual_seed(0)
    weight, x, dz = torch.randn(300, 256), torch.randn(4, 256), torch.randn(4, 300)
    with onednn.packed([], with_transpose=True, matrices=[weight]):
        assert torch.allclose(onednn.times_transpose(x, weight), x @ weight.t(), atol=1e-4)
        assert torch.allclose(onednn.times(dz, weight), dz @ weight, atol=1e-4)
        assert onednn.times_transpose(x, weight.clone()) is None  # another tensor of the same values
        assert onednn.times_transpose(x.double(), weight) is None
        weight.mul_(2)  # changed in place since packing
        assert onednn.times_transpose(x, weight) is None and onednn.times(dz, weight) is None
    with onednn.packed([], with_transpose=False, matrices=[weight]):
        assert onednn.times_transpose(x, weight) is not None and onednn.times(dz, weight) is None  # no transpose
    assert onednn.times_transpose(x, weight) is None  # freed on exit
