"""What glibc does with freed large buffers: back to the kernel (a sharded learner) or kept for reuse (one learner).

glibc serves an allocation at or above its mmap threshold with ``mmap`` and returns it to the kernel when it
is freed; smaller ones come from the heap, whose freed fragments mostly stay resident. By default the
threshold follows the largest block freed so far (up to 32 MiB), so once a sharded step has freed a
gathered block or a gradient buffer, the step's many buffers of a few to 30 MB are carved from the heap and
the resident peak creeps up from step to step. Measured with ``python -m benchmarks sharding`` on all 24
layers of Qwen2.5-0.5B's shape, full fine-tuning, two learners: the step's peak above baseline was 0.625x
to 0.66x one learner's over three steps, 0.517x with the threshold fixed at 1 MiB (docs/performance.md).

One learner with its generator in a process wants the opposite: its buffers are the same every step. By default
glibc trims the heap's freed top back to the kernel once it exceeds twice the mmap threshold, and the next buffer
faults the pages in again, zeroed (about 0.45 s per GiB on this project's machine). ``keep_freed_memory`` fixes
the threshold at glibc's largest (32 MiB) and stops the trimming, so buffers up to 32 MiB reuse pages faulted in
once. Larger ones (a 0.5B model's LM-head chunks, a micro-batch's MLP activations above 1,700 tokens) stay fresh
mappings: served from the heap as well, they fragmented it so that the job was killed for memory at 24 GiB
(twice). At the end of each learner step ``release_kept_memory`` gives the heap's free pages back
(``malloc_trim``), so what one step freed does not stay resident through the next.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
LARGEST_MMAP_THRESHOLD = 32 << 20  # mallopt refuses more on 64-bit
DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's default
NO_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1) turns trimming off


_keeping = False  # whether keep_freed_memory is in force in this process


def _glibc(function: str):
    """glibc's ``function``, or None where the C library is not glibc."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), function)
    except (OSError, AttributeError):
        return None


def _mallopt(settings: list[tuple[int, int]]) -> bool:
    """Apply ``(parameter, value)`` settings with glibc's ``mallopt``; False where the C library is not glibc."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and all([bool(mallopt(parameter, value)) for parameter, value in settings])


def return_large_frees(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` for the rest of this process (which also stops it
    from rising), with trimming at glibc's default; False where the C library is not glibc."""
    global _keeping
    _keeping = False
    return _mallopt([(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD), (M_MMAP_THRESHOLD, threshold_bytes)])


def keep_freed_memory() -> bool:
    """Serve allocations up to 32 MiB from glibc's heap and never trim it, so that their freed pages are reused
    instead of faulted in again; False where the C library is not glibc."""
    global _keeping
    _keeping = _mallopt([(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD), (M_TRIM_THRESHOLD, NO_TRIM)])
    return _keeping


def release_kept_memory() -> bool:
    """Where ``keep_freed_memory`` is in force, give the free pages of every arena back to the kernel
    (``malloc_trim(0)``); whether anything was released."""
    trim = _glibc("malloc_trim") if _keeping else None
    return trim is not None and bool(trim(0))
