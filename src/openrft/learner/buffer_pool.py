"""Collective buffers reused across FSDP's gathers on CPU, instead of fresh pages each time.

On a GPU, FSDP2's all-gather outputs and reduce-scatter buffers come from the CUDA caching allocator and are
reused block after block. On CPU each one is a new ``malloc``: with the sharded learner's fixed mmap threshold
(``learner/heap.py``) every buffer over 1 MiB is a fresh mapping whose pages the kernel faults in and zeroes
on first touch. Measured on all 24 layers of Qwen2.5-0.5B's shape with two learners, a rank faulted in about
17 GiB a step (one learner: 2.7 GiB), most of it these buffers and the gathered parameters, at about 0.45 s
per GiB on this project's machine. ``BufferPool`` hands out buffers it keeps, taking back one as soon as
nothing but the pool refers to its memory (no tensor or view of it is alive), so a step reuses the same few
pages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

MAX_POOLED_BYTES = 256 * 2**20


def _use_count(tensor: torch.Tensor) -> int:
    """How many tensors (views included) share ``tensor``'s memory, plus a constant."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


class BufferPool:
    """Flat buffers by (elements, dtype, device), each handed out again once every tensor that used it is gone.

    Buffers over ``max_pooled_bytes`` (a vocabulary-sized embedding's) are allocated fresh and not kept: holding
    one between uses would cost more resident memory than its page faults cost time."""

    def __init__(self, max_pooled_bytes: int = MAX_POOLED_BYTES):
        self.max_pooled_bytes = max_pooled_bytes
        self._buffers: dict[tuple, list[tuple[torch.Tensor, int]]] = {}

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP2's ``allocate`` of a custom collective (keyword-only ``dtype`` and ``device``)."""
        numel = math.prod(int(n) for n in size)
        if numel * torch.empty((), dtype=dtype).element_size() > self.max_pooled_bytes:
            return torch.empty(size, dtype=dtype, device=device)
        kept = self._buffers.setdefault((numel, dtype, torch.device(device)), [])
        for buffer, idle in kept:
            if _use_count(buffer) == idle:
                return buffer.view(size)
        buffer = torch.empty(numel, dtype=dtype, device=device)
        kept.append((buffer, _use_count(buffer)))
        return buffer.view(size)

    @property
    def kept_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for kept in self._buffers.values() for b, _ in kept)
