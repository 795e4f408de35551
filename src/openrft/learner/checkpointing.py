"""Activation checkpointing of the decoder layers, made to work with the learner's shared prompt cache.

transformers' own switch drops the KV cache of a checkpointed layer (a replayed layer would write its keys
twice), which would cut every response off its prompt. Here the prompts run with checkpointing suspended
(their cache is written once), and the responses then read that cache frozen (``kv.freeze``), so a layer
replayed in backward sees the same keys: each layer keeps only its input, and recomputes the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer


def _layers(model: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_activation_checkpointing(model: torch.nn.Module) -> int:
    """Checkpoint every decoder layer of ``model``; the number of layers. A model without transformers'
    checkpointable layers is refused."""
    layers = _layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable decoder layers: activation checkpointing")
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
        layer._can_checkpoint_with_cache = True  # safe: the learner's continuation cache is frozen
    model._openrft_checkpointed = layers  # read by ``suspended`` without walking the modules each pass
    return len(layers)


@contextmanager
def suspended(model: torch.nn.Module) -> Iterator[None]:
    """Run a block (a pass that writes the KV cache) without activation checkpointing."""
    layers = [layer for layer in getattr(model, "_openrft_checkpointed", ()) if layer.gradient_checkpointing]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True
