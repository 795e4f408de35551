"""The trainable policy: LoRA on a base model (or full fine-tuning), and its reference policy.

With LoRA the reference is a second adapter on the same base weights, holding a frozen copy of the
policy adapter taken every ``refit_freq`` steps; before the first refit it is the base model itself
(the adapter disabled). No second model is loaded. Without LoRA the reference is a frozen copy.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

from openrft.learner.adapter_switch import AdapterSwitch
from openrft.learner.lora_fused import fuse_lora_linears
from openrft.spec.job import LoraSpec

POLICY_ADAPTER = "default"
REFERENCE_ADAPTER = "reference"


def lora_config(spec: LoraSpec) -> LoraConfig:
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


class Policy:
    """The model the learner trains and (on one machine) the generator samples from."""

    def __init__(self, base_model: torch.nn.Module, lora: LoraSpec, need_reference: bool):
        self.lora_enabled = lora.enabled
        if lora.enabled:
            self.model = get_peft_model(base_model, lora_config(lora), adapter_name=POLICY_ADAPTER)
            fuse_lora_linears(self.model)
            self._switch = AdapterSwitch(self.model)
            # PEFT's wrappers start in train mode whatever the base's: one mode throughout, or the learner, which
            # reads the top module's, would train an eval-mode model (no dropout, no activation checkpointing)
            self.model.train(base_model.training)
        else:
            self.model = base_model
            self.model.requires_grad_(True)
        self.need_reference = need_reference
        self._reference_model: torch.nn.Module | None = None
        self._reference_is_base = True  # before the first refit the reference is the initial policy
        if need_reference and not lora.enabled:
            self.refit_reference()  # full fine-tuning changes the base weights: snapshot them now

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The weights a generator needs to serve the current policy (adapter only with LoRA)."""
        if self.lora_enabled:
            state = get_peft_model_state_dict(self.model, adapter_name=POLICY_ADAPTER)
        else:
            state = self.model.state_dict()
        return {k: v.detach().clone() for k, v in state.items()}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.lora_enabled:
            set_peft_model_state_dict(self.model, state, adapter_name=POLICY_ADAPTER)
        else:
            self.model.load_state_dict(state)

    # reference policy -------------------------------------------------------------------------

    def refit_reference(self) -> None:
        """Make the reference a frozen copy of the current policy."""
        if not self.need_reference:
            return
        if not self.lora_enabled:
            self._reference_model = copy.deepcopy(self.model).requires_grad_(False).eval()
        else:
            self._load_reference_adapter(self.adapter_state())
        self._reference_is_base = False

    def reference_state(self) -> dict[str, torch.Tensor] | None:
        if self._reference_is_base or not self.need_reference:
            return None
        if self.lora_enabled:
            state = get_peft_model_state_dict(self.model, adapter_name=REFERENCE_ADAPTER)
        else:
            state = self._reference_model.state_dict()
        return {k: v.detach().clone() for k, v in state.items()}

    def load_reference_state(self, state: dict[str, torch.Tensor] | None) -> None:
        if state is None or not self.need_reference:
            self._reference_is_base = True
            self._reference_model = None
            return
        if self.lora_enabled:
            self._load_reference_adapter(state)
        else:
            self._reference_model = copy.deepcopy(self.model).requires_grad_(False).eval()
            self._reference_model.load_state_dict(state)
        self._reference_is_base = False

    def _load_reference_adapter(self, state: dict[str, torch.Tensor]) -> None:
        model: PeftModel = self.model
        if REFERENCE_ADAPTER not in model.peft_config:
            model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[POLICY_ADAPTER]))
            model.set_adapter(POLICY_ADAPTER)  # add_adapter leaves the policy active; be explicit
            self._switch.forget()
        set_peft_model_state_dict(model, state, adapter_name=REFERENCE_ADAPTER)
        for name, param in model.named_parameters():
            if f".{REFERENCE_ADAPTER}." in name:
                param.requires_grad_(False)

    @contextmanager
    def reference_forward(self):
        """Inside this context ``self.model`` (or the returned module) computes the reference policy."""
        if not self.lora_enabled:
            yield self._reference_model if self._reference_model is not None else self.model
            return
        layers = self._switch.layers()
        if layers is not None:  # the LoRA layers' own switches (learner/adapter_switch.py)
            switched = (
                self._switch.disabled(layers)
                if self._reference_is_base
                else self._switch.active(REFERENCE_ADAPTER, layers)
            )
            with switched:
                yield self.model
            return
        if self._reference_is_base:
            # the tuner's own switch: PeftModel.disable_adapter also scans every layer's status first (4 ms a step)
            self.model.base_model.disable_adapter_layers()
            try:
                yield self.model
            finally:
                self.model.base_model.enable_adapter_layers()
            return
        self.model.base_model.set_adapter(REFERENCE_ADAPTER)
        try:
            yield self.model
        finally:
            self.model.base_model.set_adapter(POLICY_ADAPTER)
            for name, param in self.model.named_parameters():
                if f".{REFERENCE_ADAPTER}." in name:
                    param.requires_grad_(False)
