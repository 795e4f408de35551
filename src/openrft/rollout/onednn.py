"""Generation's linear layers on oneDNN (``openrft/onednn.py``), with weights packed for one ``generate`` call.

A decode step multiplies a few dozen rows by every weight of the model. For those skinny shapes torch's CPU
``linear`` is far from the machine's peak on some CPUs: on an AMD EPYC at Qwen2.5-0.5B's shape, 64 rows at 2
threads, it ran the MLP's projections at 80-114 GFLOP/s and the LM head at 44-68, where oneDNN on a packed copy of
the weight ran them at 130-148 and 90-119; generation ran 60.2 -> 77.4 tokens/s in the real-shape job
(docs/performance.md, the generation table of "What each optimisation buys"). vLLM's CPU backend calls oneDNN too.

The packed copy costs one more copy of the weights while a call runs, and one pass over them to make it: less than a
decode step's own traffic, so it pays from a few tokens on (``MIN_NEW_TOKENS``). It is made only for ``packable``
layers (fp32 ``nn.Linear`` on a CPU, large enough: not LoRA's factors), when the machine has room for it
(``fits``); it is freed when the call ends, so a trained weight is never stale in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

from openrft import onednn

MIN_NEW_TOKENS = 8
"""Packing passes over the weights once, as a decode step does: below this many new tokens it is not worth it."""


def fits(packed_bytes: int, available: int) -> bool:
    """Whether a packed copy of ``packed_bytes`` leaves as much again free (what generation itself needs)."""
    return 2 * packed_bytes <= available


def usable(model: torch.nn.Module, max_new_tokens: int) -> list[torch.nn.Linear]:
    """The layers to pack for a ``generate`` call of ``max_new_tokens``; empty where packing would not pay or fit."""
    if max_new_tokens < MIN_NEW_TOKENS or not onednn.available():
        return []
    layers = [m for m in model.modules() if onednn.packable(m)]
    size = onednn.packed_bytes([m.weight for m in layers], with_transpose=False)
    return layers if layers and fits(size, int(psutil.virtual_memory().available)) else []


@contextmanager
def packed_linears(model: torch.nn.Module, max_new_tokens: int) -> Iterator[int]:
    """Inside, the ``usable`` layers of ``model`` compute with oneDNN on packed copies of their weights (under
    ``no_grad``); yields how many. The layers' own ``forward`` is back when it exits, and the copies are freed."""
    with onednn.packed(usable(model, max_new_tokens), with_transpose=False) as count:
        yield count
