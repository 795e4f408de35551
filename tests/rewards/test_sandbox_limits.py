"""Limits that hold for a whole sandbox, not one process: memory of all its processes and tmpfs files together,
process count, scratch bytes, answer size; each failed call names the limit that ended it."""

import asyncio

import pytest

from openrft.calls.sandbox import SandboxPool, mechanism
from openrft.calls.sandbox.mechanism import cgroups_unavailable, enforcement_gaps
from openrft.spec.rewards import SandboxSpec
from tests.rewards.helpers import require_bwrap

MB = 1 << 20
CODE = """
import os, time

def hold_in_children(count, mb):
    # each child touches `mb` MB and keeps it for a second; how many of them exit normally
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                block = bytearray(mb << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(1.0)
                os._exit(0)
            except BaseException:
                os._exit(1)
        pids.append(pid)
    return sum(os.waitpid(pid, 0)[1] == 0 for pid in pids)

def fork_many(count):
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        pids.append(pid)
    return len(pids)

def fill(path, count, mb):
    written = 0
    for i in range(count):
        with open(os.path.join(path, f"blob{i}"), "wb") as f:
            for _ in range(mb):
                f.write(b"x" * (1 << 20))
                written += 1
    return written

def try_write(path):
    try:
        open(path, "w").write("x")
        return "written"
    except OSError as exc:
        return exc.strerror

def big_answer(mb):
    return "x" * (mb << 20)

def ok():
    return 1
"""


def run(spec: SandboxSpec, calls: list[tuple[str, list]], limit: float = 30.0):
    async def go():
        pool = SandboxPool(spec)
        try:
            return [await pool.call(CODE, entry, args, limit) for entry, args in calls]
        finally:
            await pool.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def cgroups_here():
    require_bwrap()
    return cgroups_unavailable() is None


def test_the_filesystem_is_read_only_but_for_sized_tmpfs_scratch(cgroups_here):
    spec = SandboxSpec(workers=1, memory_limit_mb=1024, scratch_limit_mb=32)
    results = run(
        spec,
        [
            ("try_write", ["/evil"]),
            ("try_write", ["/dev/evil"]),
            ("fill", ["/dev/shm", 4, 200]),
            ("fill", [".", 4, 200]),
            ("ok", []),
        ],
    )
    assert [r.value for r in results[:2]] == ["Read-only file system", "Read-only file system"]
    shm, scratch, after = results[2:]
    assert shm.kind == "runtime_error" and "No space left on device" in shm.message
    assert scratch.kind == "runtime_error" and scratch.limit == "scratch"
    assert "scratch directory is full: it holds 32 MB" in scratch.message
    assert after.ok and after.value == 1  # a fresh sandbox: the pool keeps serving


def test_memory_is_limited_for_all_the_processes_of_a_sandbox(cgroups_here):
    spec = SandboxSpec(workers=1, memory_limit_mb=320)
    held, after = run(spec, [("hold_in_children", [3, 200]), ("ok", [])])
    if not cgroups_here:
        assert any("memory of a sandbox's processes together" in gap for gap in enforcement_gaps())
        return
    assert held.ok and held.value < 3, held  # 3 x 200 MB never fit in 320 MB at once
    assert after.ok


def test_a_fork_bomb_stops_at_the_process_limit(cgroups_here):
    spec = SandboxSpec(workers=1, memory_limit_mb=1024, max_processes=16)
    bomb, after = run(spec, [("fork_many", [1000]), ("ok", [])])
    if not cgroups_here:
        assert any("number of its processes are not limited" in gap for gap in enforcement_gaps())
        return
    assert bomb.kind == "runtime_error" and bomb.limit == "processes", bomb
    assert "limit of 16 processes" in bomb.message
    assert after.ok


def test_an_answer_past_the_output_limit_is_refused_and_the_worker_replaced():
    require_bwrap()
    big, after = run(SandboxSpec(workers=1, output_limit_mb=1), [("big_answer", [2]), ("ok", [])])
    assert big.kind == "invalid_output" and big.limit == "output" and "output limit of 1 MB" in big.message
    assert after.ok and after.value == 1


def test_what_is_not_enforced_without_cgroups_is_said(monkeypatch):
    """Where the host offers no usable cgroups, the gaps ``openrft serve`` logs at startup name what is lost."""
    require_bwrap()
    monkeypatch.setattr(
        mechanism, "cgroup_layout", lambda: (None, "cgroup v2 at /x does not delegate the memory controller")
    )
    gaps = enforcement_gaps()
    assert len(gaps) == 1 and "does not delegate the memory controller" in gaps[0]
    assert "number of its processes are not limited" in gaps[0]
