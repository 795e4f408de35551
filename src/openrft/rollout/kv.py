"""Shared-prefix forward passes: each distinct prompt through the model once, its KV cache then
gathered onto every sequence that continues it.

The generator uses this to sample the ``n`` completions of a prompt from one prefill; the learner
uses it to score (and differentiate) the ``n`` responses of a prompt without recomputing the
prompt ``n`` times. The cache gather is an indexing op, so gradients flow back into the prompt.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward() argument that takes a KV cache: ``cache`` in recent transformers releases,
    ``past_key_values`` before (the old name still works there, with a deprecation warning)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, attention mask and position ids ``[batch, width]``, left-padded so that every sequence
    ends at the last column (its next-token logits are then ``logits[:, -1]``)."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_token_id] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def forward_outputs(model: torch.nn.Module, hidden: bool, **kwargs) -> torch.Tensor:
    """``model``'s logits; or (``hidden``) its decoder's last hidden states, taken by a hook while the language-model
    head runs on no position at all (``logits_to_keep`` as an empty list of positions). The model's own forward
    runs either way, so that wrappers around it (PEFT, FSDP's root unit) see every pass.

    Why no position rather than the last one: those logits are never used, and on a slice of the last position of
    a sequence that requires grad, ``matmul`` multiplies each row by its own broadcast copy of the head (one
    ``bmm`` reading the whole head per row: 46 ms a row at a 151,936-token vocabulary on one CPU thread)."""
    if not hidden:
        return model(**kwargs).logits
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    captured: list[torch.Tensor] = []
    handle = base.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out.last_hidden_state))
    no_position = torch.empty(0, dtype=torch.long, device=kwargs["input_ids"].device)
    try:
        model(**{**kwargs, "logits_to_keep": no_position})
    finally:
        handle.remove()
    return captured[-1]


def prefill(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache_kwarg: str,
    hidden: bool = False,
) -> tuple[torch.Tensor, DynamicCache]:
    """Run left-padded prompts through ``model``; returns the last position's logits ``[prompts, vocab]``
    (the language-model head runs on that position only) and the filled KV cache. ``hidden``: the last
    position's hidden state ``[prompts, hidden]`` before the head instead."""
    cache = DynamicCache()
    out = forward_outputs(
        model,
        hidden,
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg: cache},
    )
    return out[:, -1, :], cache


def continue_from(
    model: torch.nn.Module,
    cache: DynamicCache,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache_kwarg: str,
    hidden: bool = False,
) -> torch.Tensor:
    """Logits ``[rows, width, vocab]`` of ``ids`` continuing the sequences held in ``cache``; ``mask``
    covers the cached positions and the new ones. ``hidden``: as for ``prefill``, hidden states."""
    kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "use_cache": True}
    return forward_outputs(model, hidden, **kwargs, **{cache_kwarg: cache})


class ReadOnlyLayer(DynamicLayer):
    """A cache layer whose ``update`` returns the cached states and the new ones without keeping the new ones."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def freeze(cache: DynamicCache) -> bool:
    """Make a filled cache read-only, so that a layer run twice on it (activation checkpointing recomputes it
    in backward) sees the same keys both times. False (and the cache unchanged) if a layer is not a plain
    ``DynamicLayer`` (sliding windows, quantised caches)."""
    if not all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers):
        return False
    for i, layer in enumerate(cache.layers):
        frozen = ReadOnlyLayer.__new__(ReadOnlyLayer)
        frozen.__dict__.update(layer.__dict__)
        cache.layers[i] = frozen
    return True
