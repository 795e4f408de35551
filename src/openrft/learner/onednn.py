"""The learner's frozen base weights on oneDNN (``openrft/onednn.py``) for one pass over a batch.

With LoRA the base weights do not train: the learner multiplies its activations by them in the policy's forward,
the reference's forward and the input's gradient in backward, three times per token. The decoder's linear layers
and the LM head (which the learner applies itself, chunked: ``learner/logprobs.py``) are packed, each weight and its
transpose, for the batch and freed at its end. That costs two passes over the weights and their memory twice, which
pays from a few hundred tokens on (``MIN_TOKENS``); it is done only when the copies and the micro-batch's activations
leave as much again free (``fits``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

from openrft import onednn
from openrft.learner.logprobs import can_chunk, unwrap

MIN_TOKENS = 512
"""Response tokens in a batch below which packing (two passes over the weights) costs more than it saves."""


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The decoder's ``packable`` linear layers whose weight and bias are frozen (LoRA's base layers)."""
    base = unwrap(model)
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base
    return [m for m in decoder.modules() if onednn.packable(m) and onednn.frozen(m)]


def head_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The LM head's weight, where the learner applies it chunked (``can_chunk``) and it is frozen and packable."""
    if not can_chunk(model):
        return []
    head = unwrap(model).get_output_embeddings()
    return [head.weight] if onednn.packable(head) and onednn.frozen(head) and head.bias is None else []


def fits(packed_bytes: int, activation_bytes: int, available: int) -> bool:
    """Whether the copies and a micro-batch's activations leave as much again as the copies free."""
    return 2 * packed_bytes + activation_bytes <= available


@contextmanager
def frozen_linears(model: torch.nn.Module, tokens: int, activation_bytes: int) -> Iterator[int]:
    """Inside, the decoder's frozen layers and the LM head compute forward and the input's gradient on oneDNN, for a
    batch of ``tokens`` response tokens; yields how many weights are packed (none where it would not pay or fit)."""
    layers, heads = [], []
    if tokens >= MIN_TOKENS and onednn.available():
        layers, heads = decoder_layers(model), head_weights(model)
        size = onednn.packed_bytes([m.weight for m in layers] + heads, with_transpose=True)
        if not fits(size, activation_bytes, int(psutil.virtual_memory().available)):
            layers, heads = [], []
    with onednn.packed(layers, with_transpose=True, matrices=heads) as count:
        yield count + len(heads)
