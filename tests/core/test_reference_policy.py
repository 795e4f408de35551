"""The learner's reference policy (learner/policy.py): the base model before the first refit, a frozen copy of the
adapter after it; the policy's adapter stays trainable either way. And the model loader's switches."""

import copy

import pytest
import torch
from peft.tuners.lora import LoraModel

from openrft.learner.adapter_switch import AdapterSwitch
from openrft.learner.policy import Policy
from openrft.models import load_causal_lm
from openrft.spec.job import LoraSpec


def _policy() -> tuple[Policy, torch.nn.Module]:
    torch.manual_seed(0)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float64)
    base = copy.deepcopy(model)
    policy = Policy(model, LoraSpec(enabled=True, rank=4, alpha=8), need_reference=True)
    for name, param in policy.model.named_parameters():
        if "lora_B" in name:  # a fresh adapter's B is zero: the policy would equal the base
            param.data.normal_(std=0.5)
    return policy, base


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _trainable(policy: Policy) -> set[str]:
    return {name for name, param in policy.model.named_parameters() if param.requires_grad}


@pytest.fixture(params=["layers", "peft"])
def switch_only_by(request, monkeypatch):
    """Called once the policy is built: from then on the reference is switched on the LoRA layers themselves (PEFT's
    own switches would fail the test), or by PEFT (a model the layer switch leaves to it: ``modules_to_save``)."""

    def arm() -> None:
        if request.param == "layers":
            for name in ("set_adapter", "disable_adapter_layers", "enable_adapter_layers"):
                monkeypatch.setattr(LoraModel, name, lambda *a, **k: pytest.fail("PEFT's switch walked the model"))
        else:
            monkeypatch.setattr(AdapterSwitch, "layers", lambda self: None)

    return arm


def test_before_the_first_refit_the_reference_is_the_base_model_and_the_adapter_stays_trainable(switch_only_by):
    policy, base = _policy()
    switch_only_by()
    ids = torch.randint(0, 90, (3, 7))
    trainable = _trainable(policy)
    assert trainable and all("lora_" in name for name in trainable)
    policy_logits = _logits(policy.model, ids)
    with policy.reference_forward() as reference:
        reference_logits = _logits(reference, ids)
    assert torch.allclose(reference_logits, _logits(base, ids), atol=1e-12)
    assert not torch.allclose(reference_logits, policy_logits, atol=1e-3)  # the adapter does move the policy
    assert torch.equal(_logits(policy.model, ids), policy_logits)  # the adapter is back on after the context
    assert _trainable(policy) == trainable


def test_after_a_refit_the_reference_is_the_adapter_as_it_was_then(switch_only_by):
    policy, _ = _policy()
    ids = torch.randint(0, 90, (2, 5))
    policy.refit_reference()  # adding the reference adapter is PEFT's
    switch_only_by()
    at_refit = _logits(policy.model, ids)
    trainable = _trainable(policy)
    for name, param in policy.model.named_parameters():
        if "lora_B" in name and ".default." in name:
            param.data.add_(0.3)
    with policy.reference_forward() as reference:
        assert torch.allclose(_logits(reference, ids), at_refit, atol=1e-12)
    assert not torch.allclose(_logits(policy.model, ids), at_refit, atol=1e-3)
    assert _trainable(policy) == trainable


def test_loaded_models_do_not_use_hub_kernels():
    """transformers 5 turns its Hub kernels on by default; train()/eval() then re-kernelize the model each time."""
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    assert not getattr(model, "use_kernels", False)
