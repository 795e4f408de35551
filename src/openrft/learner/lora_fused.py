"""LoRA's update added into the base layer's output in place, instead of built as activations of that size.

PEFT's LoRA linear computes ``base(x) + lora_B(lora_A(dropout(x))) * scaling``: the update, its scaled copy and
the sum are each a new ``[tokens, out_features]`` tensor, and backward makes another scaled copy of the output
gradient. At Qwen2.5-0.5B's shape these are 20 MB per MLP projection and micro-batch of 1,000 tokens; in the
profile of a learner step (``python -m benchmarks real-shape-profile``) the scaling, the sum and ``lora_B``'s
write of its output took a quarter of the step, while their FLOPs are under 1% of it.

``FusedLoraLinear`` computes ``base(x)`` and adds the update into it with one ``addmm_`` (``alpha = scaling``):
no tensor of the output's size but the output. Autograd allows it: a linear layer's backward needs its input
and weight, never its output. Anything but one plain adapter on a plain ``nn.Linear`` (adapters disabled or
merged, several active, DoRA and other variants, a LoRA bias, mixed dtypes, extra arguments) runs PEFT's own
forward.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import Linear as LoraLinear


class FusedLoraLinear(LoraLinear):
    """PEFT's LoRA ``Linear`` with the update added in place (module docstring)."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapter = None if args or kwargs else self._plain_adapter(x)
        if adapter is None:
            return super().forward(x, *args, **kwargs)
        lora_a, lora_b = self.lora_A[adapter], self.lora_B[adapter]
        # in 2-D throughout: an in-place op on a view of the output would make autograd copy the whole gradient
        # twice in backward (CopySlices); on the output itself it passes the gradient through
        x2d = x.reshape(-1, x.shape[-1])
        result = self.base_layer(x2d)
        update_in = lora_a(self.lora_dropout[adapter](x2d))
        result.addmm_(update_in, lora_b.weight.t(), alpha=self.scaling[adapter])
        return result.view(*x.shape[:-1], result.shape[-1])

    def _plain_adapter(self, x: torch.Tensor) -> str | None:
        """The one active vanilla adapter, when the fused path computes what PEFT's forward would; else None."""
        if self.disable_adapters or self.merged or len(self.active_adapters) != 1:
            return None
        adapter = self.active_adapters[0]
        if adapter not in self.lora_A or adapter in self.lora_variant:
            return None
        base, lora_a, lora_b = self.base_layer, self.lora_A[adapter], self.lora_B[adapter]
        if type(base) is not torch.nn.Linear or type(lora_a) is not torch.nn.Linear or lora_b.bias is not None:
            return None
        if not x.dtype == base.weight.dtype == lora_a.weight.dtype == lora_b.weight.dtype:
            return None
        return adapter


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Make every PEFT LoRA ``Linear`` in ``model`` a ``FusedLoraLinear`` (the same object, its class swapped:
    parameters, adapters and hooks stay); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is LoraLinear:
            module.__class__ = FusedLoraLinear
            count += 1
    return count
