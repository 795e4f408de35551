"""Generation's linear layers on oneDNN, with weights packed for the duration of one ``generate`` call.

A decode step multiplies a few dozen rows by every weight of the model. For those skinny shapes torch's CPU
``linear`` (MKL's sgemm in the PyPI wheels) is far from the machine's peak on some CPUs: on an AMD EPYC at
Qwen2.5-0.5B's shape, 64 rows at 2 threads, it ran the MLP's projections at 80-114 GFLOP/s and the LM head at 44-68,
where oneDNN's ``mkldnn_linear`` on a packed copy of the weight ran them at 130-135 and 90-92; generation ran
1.15-1.31x faster with the same samples, 60.2 -> 77.4 tokens/s in the real-shape job (docs/performance.md, the
generation table of "What each optimisation buys"). vLLM's CPU backend calls oneDNN too.

The packed copy costs one more copy of the weights while a call runs, and one pass over them to make it: less than a
decode step's own traffic, so it pays from a few tokens on (``MIN_NEW_TOKENS``). It is made only on a CPU, for fp32
weights of ``nn.Linear`` layers large enough to matter (``MIN_WEIGHT``: not LoRA's factors), when the machine has
room for it (``fits``); it is freed when the call ends, so the learner never holds it, and a trained weight is never
stale in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

MIN_WEIGHT = 1 << 16
"""Weights with fewer elements keep torch's ``linear``: LoRA's factors and toy models, where a call's overhead wins."""

MIN_NEW_TOKENS = 8
"""Packing passes over the weights once, as a decode step does: below this many new tokens it is not worth it."""


def packable(module: torch.nn.Module) -> bool:
    """A plain fp32 ``nn.Linear`` on a CPU, large enough, whose ``forward`` nobody else has replaced (the sharded
    learner's vocabulary-parallel head sets its own on the instance)."""
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear
        and "forward" not in module.__dict__
        and weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= MIN_WEIGHT
    )


def fits(packed_bytes: int, available: int) -> bool:
    """Whether a packed copy of ``packed_bytes`` leaves as much again free (what generation itself needs)."""
    return 2 * packed_bytes <= available


def usable(model: torch.nn.Module, max_new_tokens: int) -> list[torch.nn.Linear]:
    """The layers to pack for a ``generate`` call of ``max_new_tokens``; empty where packing would not pay or fit."""
    if max_new_tokens < MIN_NEW_TOKENS or not torch.backends.mkldnn.is_available():
        return []
    layers = [m for m in model.modules() if packable(m)]
    size = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    return layers if layers and fits(size, int(psutil.virtual_memory().available)) else []


def _packed_forward(layer: torch.nn.Linear):
    packed, version = layer.weight.detach().to_mkldnn(), layer.weight._version

    def forward(x: torch.Tensor) -> torch.Tensor:
        # what the packed copy cannot serve: a gradient, another dtype, a weight changed in place since (a learner
        # sharing the model in another thread)
        if x.dtype != torch.float32 or torch.is_grad_enabled() or layer.weight._version != version:
            return torch.nn.functional.linear(x, layer.weight, layer.bias)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), packed, layer.bias).to_dense()
        return y.view(*x.shape[:-1], layer.out_features)

    return forward


@contextmanager
def packed_linears(model: torch.nn.Module, max_new_tokens: int) -> Iterator[int]:
    """Inside, the ``usable`` layers of ``model`` compute with oneDNN on packed copies of their weights (under
    ``no_grad``); yields how many. The layers' own ``forward`` is back when it exits, and the copies are freed."""
    layers = usable(model, max_new_tokens)
    try:
        for layer in layers:
            layer.forward = _packed_forward(layer)
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
