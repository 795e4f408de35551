"""``openrft.learner.heap.return_large_frees`` (called by the sharded learner): after a large buffer has been
freed, glibc's default keeps later frees of a few MB resident in its heap; with the threshold fixed they go
back to the kernel. Each case in a fresh process (the setting is process-wide), with libc's own malloc."""

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import ctypes, re, sys
from pathlib import Path
from openrft.learner.heap import return_large_frees

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

if sys.argv[1] == "fixed":
    assert return_large_frees()
libc.free(touched(24 * MB))  # glibc's default threshold follows it up to 24 MB
before = resident_mb()
chunks = [touched(8 * MB) for _ in range(8)]
for pointer in chunks[:-1]:  # the last stays allocated, above the others in the heap
    libc.free(pointer)
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
