"""Freed large buffers go back to the kernel in a sharded learner's process.

glibc serves an allocation at or above its mmap threshold with ``mmap`` and returns it to the kernel when it
is freed; smaller ones come from the heap, whose freed fragments mostly stay resident. By default the
threshold follows the largest block freed so far (up to 32 MiB), so once a sharded step has freed a
gathered block or a gradient buffer, the step's many buffers of a few to 30 MB are carved from the heap and
the resident peak creeps up from step to step. Measured with ``python -m benchmarks sharding`` on all 24
layers of Qwen2.5-0.5B's shape, full fine-tuning, two learners: the step's peak above baseline was 0.625x
to 0.66x one learner's over three steps, 0.517x with the threshold fixed at 1 MiB (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_frees(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` for the rest of this process (which also stops it
    from rising); False where the C library is not glibc (nothing is changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes))
