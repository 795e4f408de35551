"""LoRA's update added in place (learner/lora_fused.py): PEFT's outputs and gradients, without PEFT's
output-sized temporaries, and PEFT's own forward wherever the fused one would differ."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from openrft.learner.lora_fused import FusedLoraLinear, fuse_lora_linears
from tests.tiny_models import tiny_qwen2


def _pair(**config):
    """The same LoRA model twice, PEFT's and fused, with a non-zero B (a fresh adapter's B is zero)."""
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", **config)
    peft_model = get_peft_model(tiny_qwen2(64, 32).double(), lora)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(std=0.1)
    fused = copy.deepcopy(peft_model)
    return peft_model, fused, fuse_lora_linears(fused)


def _loss_and_grads(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = (logits.square() * torch.linspace(0, 1, logits.shape[-1], dtype=logits.dtype)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


def test_same_outputs_and_gradients_as_peft():
    peft_model, fused, count = _pair()
    assert count == 7 * 2  # every linear of the two decoder layers (the head is not a LoRA target)
    ids = torch.randint(0, 64, (3, 9))
    want_logits, want_grads = _loss_and_grads(peft_model, ids)
    got_logits, got_grads = _loss_and_grads(fused, ids)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-12, atol=1e-12)
    assert want_grads.keys() == got_grads.keys() and len(want_grads) == 2 * count
    for name, grad in want_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_no_output_sized_temporaries():
    """PEFT's forward multiplies the update by the scaling and adds it to the base output, and its backward
    scales the output's gradient: elementwise ops over the output's size. The fused layer has none (its
    backward scales only the rank-sized gradients)."""
    from torch.profiler import profile

    peft_model, fused, _ = _pair()
    layer = fused.base_model.model.model.layers[0].mlp.up_proj
    original = peft_model.base_model.model.model.layers[0].mlp.up_proj
    x = torch.randn(5, 7, layer.in_features, dtype=torch.float64, requires_grad=True)
    output_size = 5 * 7 * layer.out_features

    def output_sized_elementwise(module) -> list[str]:
        with profile(record_shapes=True) as prof:
            module(x).sum().backward()
        return sorted(
            e.name
            for e in prof.events()
            if e.name in ("aten::mul", "aten::add")
            and any(torch.Size(shape).numel() == output_size for shape in e.input_shapes if shape)
        )

    assert type(layer) is FusedLoraLinear
    assert output_sized_elementwise(original) == ["aten::add", "aten::mul", "aten::mul"]
    assert output_sized_elementwise(layer) == []
    assert type(layer(x).grad_fn).__name__ == "ViewBackward0"  # not CopySlices: no copies of the gradient


@pytest.mark.parametrize("case", ["disabled", "merged", "two_active", "dora", "extra_argument"])
def test_falls_back_to_peft_where_it_would_differ(case):
    peft_model, fused, _ = _pair(use_dora=case == "dora")
    ids = torch.randint(0, 64, (2, 5))
    for model in (peft_model, fused):
        if case == "merged":
            model.merge_adapter()
        if case == "two_active":
            model.add_adapter("second", copy.deepcopy(model.peft_config["default"]))
            model.base_model.set_adapter(["default", "second"])
    layer = fused.base_model.model.model.layers[0].mlp.up_proj
    plain = layer._plain_adapter(torch.zeros(1, dtype=torch.float64))
    if case == "disabled":
        with peft_model.disable_adapter(), fused.disable_adapter():
            assert layer._plain_adapter(torch.zeros(1, dtype=torch.float64)) is None
            torch.testing.assert_close(fused(input_ids=ids).logits, peft_model(input_ids=ids).logits)
        return
    assert (plain is None) == (case != "extra_argument")
    if case == "extra_argument":  # PEFT's mixed-batch inference (eval only): one adapter name per row
        peft_model.eval(), fused.eval()
        names = ["default", "__base__"]
        torch.testing.assert_close(
            fused(input_ids=ids, adapter_names=names).logits, peft_model(input_ids=ids, adapter_names=names).logits
        )
        return
    torch.testing.assert_close(fused(input_ids=ids).logits, peft_model(input_ids=ids).logits)


def test_mixed_dtypes_run_peft():
    _, fused, _ = _pair()
    layer = fused.base_model.model.model.layers[0].mlp.up_proj
    assert layer._plain_adapter(torch.zeros(1, dtype=torch.float32)) is None
    assert layer._plain_adapter(torch.zeros(1, dtype=torch.float64)) == "default"
