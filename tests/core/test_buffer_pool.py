"""``openrft.learner.buffer_pool.BufferPool``: FSDP's collective buffers are handed out again once nothing uses
them, never while a tensor or a view of one is alive, and the pages are the same (no fresh page faults)."""

import resource

import torch

from openrft.learner.buffer_pool import BufferPool

CPU = torch.device("cpu")


def test_a_released_buffer_is_handed_out_again():
    pool = BufferPool()
    first = pool.allocate((1000,), dtype=torch.float32, device=CPU)
    address = first.data_ptr()
    del first
    again = pool.allocate((10, 100), dtype=torch.float32, device=CPU)
    assert again.data_ptr() == address and again.shape == (10, 100)
    assert pool.kept_bytes == 4000


def test_a_buffer_still_viewed_is_not_handed_out():
    pool = BufferPool()
    first = pool.allocate((1000,), dtype=torch.float32, device=CPU)
    first.fill_(7.0)
    view = first.view(10, 100)[3:]  # what FSDP keeps of an output: views of it
    del first
    second = pool.allocate((1000,), dtype=torch.float32, device=CPU)
    second.fill_(-1.0)
    assert second.data_ptr() != view.data_ptr()
    assert bool((view == 7.0).all()), "a buffer in use was handed out and overwritten"
    del view, second
    assert pool.allocate((1000,), dtype=torch.float32, device=CPU) is not None
    assert pool.kept_bytes == 8000  # two kept, both free again: no third one


def test_sizes_and_dtypes_are_kept_apart():
    pool = BufferPool()
    a = pool.allocate((256,), dtype=torch.float32, device=CPU)
    address = a.data_ptr()
    del a
    b = pool.allocate((256,), dtype=torch.bfloat16, device=CPU)
    c = pool.allocate((128,), dtype=torch.float32, device=CPU)
    assert address not in (b.data_ptr(), c.data_ptr())
    assert b.dtype == torch.bfloat16 and c.numel() == 128


def test_a_buffer_over_the_limit_is_not_kept():
    pool = BufferPool(max_pooled_bytes=1024)
    big = pool.allocate((1024,), dtype=torch.float32, device=CPU)
    assert big.numel() == 1024 and pool.kept_bytes == 0


def test_reuse_touches_no_new_pages():
    """Eight 40 MiB gathers one after another fault in one buffer's pages, not eight (40 MiB: above glibc's
    largest mmap threshold, so a fresh allocation is always a fresh mapping)."""
    pool = BufferPool()
    elements = 10 * 2**20  # 40 MiB of float32
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        pool.allocate((elements,), dtype=torch.float32, device=CPU).fill_(1.0)
    faulted_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 4096 / 2**20
    assert faulted_mib < 2 * 40, f"{faulted_mib:.0f} MiB of pages faulted in for one reused 40 MiB buffer"
