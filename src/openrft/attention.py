"""SDPA attention over chunks of query rows, so that a long sequence never holds a ``[queries, keys]`` mask.

transformers' ``sdpa`` builds the boolean mask ``[batch, 1, queries, keys]`` whenever it cannot use the
kernel's ``is_causal`` flag, which is always the case when a response continues a cached prompt (the learner's
shared prefix): 1 GiB at 32,768 tokens, and PyTorch's CPU kernel turns it into floats. ``chunked_sdpa`` is
``sdpa`` unchanged while ``queries x keys`` stays under ``MASK_ELEMENTS``; above it the mask is made per chunk
of query rows, and under autograd each chunk is recomputed in backward (activation checkpointing), so neither
masks nor attention weights are kept across chunks. Registered under ``ATTENTION`` for every model we load
with ``sdpa`` (``use_chunked_sdpa``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function, sdpa_mask

from openrft.prefix_attention import prefix_attention, prefix_layer

ATTENTION = "openrft_chunked_sdpa"
MASK_ELEMENTS = 2**25  # query rows x keys of one attention chunk (a 32 MiB boolean mask)


@dataclass
class RowChunkedMask:
    """What ``sdpa_mask`` needs to build the mask of any range of query rows."""

    arguments: dict[str, Any]
    q_length: int
    rows: int  # query rows per chunk

    def keys(self, stop: int) -> int:
        """Keys that rows before ``stop`` can see: a plain causal mask hides every later one."""
        a = self.arguments
        causal = a.get("mask_function", causal_mask_function) is causal_mask_function and a.get("kv_offset", 0) == 0
        return min(a["kv_length"], a["q_offset"] + stop) if causal else a["kv_length"]

    def rows_mask(self, start: int, stop: int) -> torch.Tensor:
        rows = {"q_length": stop - start, "q_offset": self.arguments["q_offset"] + start, "kv_length": self.keys(stop)}
        return sdpa_mask(**{**self.arguments, **rows})


def chunked_mask(
    batch_size: int, q_length: int, kv_length: int, allow_is_causal_skip: bool = True, **kwargs
) -> torch.Tensor | RowChunkedMask | None:
    """``sdpa_mask``, or for a long query a ``RowChunkedMask`` that builds it chunk by chunk."""
    rows = max(1, MASK_ELEMENTS // max(kv_length, 1))
    q_offset = kwargs.get("q_offset", 0)
    if q_length <= rows or isinstance(q_offset, torch.Tensor):
        return sdpa_mask(batch_size, q_length, kv_length, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    arguments = {**kwargs, "batch_size": batch_size, "kv_length": kv_length, "q_offset": q_offset}
    return RowChunkedMask({**arguments, "allow_is_causal_skip": False}, q_length, rows)


def _attend(mask: RowChunkedMask, start: int, stop: int, dropout: float, scaling: float | None, q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.rows_mask(start, stop), dropout_p=dropout, scale=scaling
    )


def chunked_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | RowChunkedMask | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; output ``[batch, queries, heads, head_dim]``. Keys from a
    shared-prefix cache go to ``prefix_attention``."""
    shared = prefix_layer(key)
    if shared is not None:
        return prefix_attention(shared, query, key, value, scaling or query.shape[-1] ** -0.5, dropout), None
    if not isinstance(attention_mask, RowChunkedMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # once for all chunks (per chunk, autograd would keep a copy each)
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    recompute = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    outputs = []
    for start in range(0, attention_mask.q_length, attention_mask.rows):
        stop = min(start + attention_mask.rows, attention_mask.q_length)
        keys = attention_mask.keys(stop)
        q, k, v = query[:, :, start:stop], key[:, :, :keys], value[:, :, :keys]
        args = (attention_mask, start, stop, dropout, scaling, q, k, v)
        outputs.append(checkpoint(_attend, *args, use_reentrant=False) if recompute else _attend(*args))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def register() -> None:
    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, chunked_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, chunked_mask)


def runs_chunked_sdpa(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention function is ``chunked_sdpa`` (which also takes shared-prefix caches)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == ATTENTION


def use_chunked_sdpa(model: torch.nn.Module) -> bool:
    """Switch a model that uses ``sdpa`` to ``chunked_sdpa`` (the same results below ``MASK_ELEMENTS``)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    model.set_attn_implementation(ATTENTION)
    return True
