"""``openrft.learner.heap``: ``return_large_frees`` (called by the sharded learner): after a large buffer has been
freed, glibc's default keeps later frees of a few MB resident in its heap; with the threshold fixed they go
back to the kernel. ``keep_freed_memory`` (one learner's job process): freed 24 MB buffers' pages are reused
by the next ones instead of faulted in again. Each case in a fresh process (the settings are process-wide), with
libc's own malloc."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import ctypes, re, sys
from pathlib import Path
from openrft.learner.heap import keep_freed_memory, release_kept_memory, return_large_frees

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MB = 1 << 20

def resident_mb():
    return int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

def touched(size):
    pointer = libc.malloc(size)
    ctypes.memset(pointer, 1, size)
    return pointer

if sys.argv[1] in ("kept", "kept-then-fixed", "kept-then-released"):
    assert keep_freed_memory()
if sys.argv[1] in ("fixed", "kept-then-fixed"):
    assert return_large_frees()
if sys.argv[1].startswith("faults"):
    import resource
    if sys.argv[1] == "faults-kept":
        assert keep_freed_memory()
    libc.free(touched(24 * MB))  # glibc's default threshold follows it up to 24 MB
    for _ in range(2):  # 96 MB freed at the heap's top: glibc's default trims it, the kept heap keeps it
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for pointer in [touched(24 * MB) for _ in range(4)]:
            libc.free(pointer)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 4096 / MB)
    sys.exit(0)
libc.free(touched(24 * MB))  # glibc's default threshold follows it up to 24 MB
before = resident_mb()
chunks = [touched(8 * MB) for _ in range(8)]
for pointer in chunks[:-1]:  # the last stays allocated, above the others in the heap
    libc.free(pointer)
if sys.argv[1] == "kept-then-released":
    assert release_kept_memory()
print(resident_mb() - before)
"""


def retained_mb(case: str) -> float:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, case], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


def test_freed_buffers_of_a_few_mb_leave_the_resident_set_once_the_threshold_is_fixed():
    assert retained_mb("default") > 40  # seven freed 8 MB chunks stay in glibc's heap
    assert retained_mb("fixed") < 16  # only the chunk still allocated


def test_a_freed_large_buffer_is_reused_without_page_faults_once_freed_memory_is_kept():
    assert retained_mb("faults-default") > 64  # trimmed: the second round faults its pages in again
    assert retained_mb("faults-kept") < 8  # the first round's pages, reused


def test_returning_large_frees_after_keeping_them_returns_them():
    assert retained_mb("kept") > 32  # served from the heap, not trimmed: the freed chunks stay
    assert retained_mb("kept-then-fixed") < 16  # mmap and trimming back on, at the sharded learner's threshold


def test_kept_memory_goes_back_to_the_kernel_when_released():
    assert retained_mb("kept-then-released") < 16  # malloc_trim: the free chunks' pages, all but the live one
