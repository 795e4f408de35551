"""FSDP2's all-gather and reduce-scatter through shared memory, for CPU learners on one host.

Gloo moves a collective's bytes through loopback TCP. On this project's 2-core machine an all-gather of one
decoder block's 30 MB shards took about 150 ms, and the sharded step gathers every block four times and
reduce-scatters its gradient twice, so most of a 2-learner step was spent in gloo
(benchmarks/results/sharding.md). Processes on one host can instead exchange through one shared buffer (as
DeepSpeed's and vLLM's CPU backends do): each rank copies its part into its own slot, waits at a barrier (a
gloo collective of a few bytes), reads what it needs from every slot, and waits again before the slots are
reused. The buffer has a fixed size (``budget_bytes``); a larger tensor goes through it in chunks.

Where a collective fits, it is staged in the buffer (FSDP2's ``allocate`` hook) and most copies go: an
all-gather's output is an area of the buffer, so FSDP's copy of this rank's shard into the output is its write
to the others and its copy of the output into the block's parameters is its read; a reduce-scatter's input is
this rank's segment, which FSDP fills with the gradient. ``SharedExchange`` says when each area is free again.

``SharedExchange.open`` returns None when a rank cannot see the buffer rank 0 made (another host, another
container, a ``/dev/shm`` too small); FSDP then keeps gloo. ``OPENRFT_FSDP_TRANSPORT=gloo`` keeps gloo too.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

SHM_ROOT = "/dev/shm"
BUDGET_BYTES = 256 * 2**20
TRANSPORT_VARIABLE = "OPENRFT_FSDP_TRANSPORT"


class SharedExchange:
    """A shared-memory buffer mapped by every rank of ``group``, and the two collectives FSDP runs through it.

    The buffer's first half holds staged all-gather outputs, in two alternating areas: FSDP copies a gathered
    block out when it is about to run, after it has started the next block's all-gather (its prefetch), so an
    output stays in use while the next one is written, never longer (a rank starts the all-gather after next
    only once every rank has entered the next one's barrier, which each enters after copying this one out).
    The second half is the working area: staged reduce-scatter inputs (a segment per rank) and every
    collective that does not fit a stage, copied through in chunks.
    """

    def __init__(self, group: dist.ProcessGroup, buffer: torch.Tensor):
        self.group, self.buffer = group, buffer
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.stage_bytes = buffer.numel() // 4 // 64 * 64  # each of the two all-gather areas
        self.work_offset = 2 * self.stage_bytes
        self.work_bytes = buffer.numel() - self.work_offset
        self.segment_bytes = self.work_bytes // self.world // 64 * 64  # a rank's staged reduce-scatter input
        self.next_stage = 0
        self.work_read_after_return = False  # some rank may still read the working area (a staged reduce)

    @classmethod
    def open(cls, group: dist.ProcessGroup | None = None, budget_bytes: int = BUDGET_BYTES) -> SharedExchange | None:
        """Every rank of ``group`` maps one new ``/dev/shm`` file of ``budget_bytes`` (a collective: all ranks
        call it); None on every rank when one of them cannot. The file is unlinked once all have mapped it, so
        nothing is left behind whatever happens to the processes."""
        group = group or dist.group.WORLD
        if os.environ.get(TRANSPORT_VARIABLE, "shared_memory") == "gloo":
            return None
        path = [None]
        if dist.get_rank(group) == 0:
            path[0] = _create(budget_bytes)
        dist.broadcast_object_list(path, group_src=0, group=group)
        buffer = None
        if path[0] is not None and os.path.exists(path[0]):
            try:
                buffer = torch.from_file(path[0], shared=True, size=budget_bytes, dtype=torch.uint8)
            except RuntimeError:
                buffer = None
        mapped = torch.tensor([int(buffer is not None)])
        dist.all_reduce(mapped, op=dist.ReduceOp.MIN, group=group)
        if dist.get_rank(group) == 0 and path[0] is not None:
            os.unlink(path[0])
        return cls(group, buffer) if int(mapped) == 1 else None

    # staging: FSDP2's allocate hook --------------------------------------------------------------------

    def gather_staging(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The next all-gather area as an all-gather's output of ``numel`` elements (each rank copies its
        shard into its part of it), or None when it does not fit."""
        if numel * _size(dtype) > self.stage_bytes:
            return None
        offset = self.next_stage * self.stage_bytes
        self.next_stage ^= 1
        return self._view(offset, numel, dtype)

    def scatter_staging(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """This rank's segment of the working area as a reduce-scatter's input of ``numel`` elements, or None
        when it does not fit (a collective)."""
        if numel * _size(dtype) > self.segment_bytes:
            return None
        self._claim_work()
        return self._view(self.work_offset + self.rank * self.segment_bytes, numel, dtype)

    # the collectives ------------------------------------------------------------------------------------

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        """``output`` (``world`` x ``shard``'s elements) = every rank's ``shard``, in rank order."""
        if self._within(output, 0, self.work_offset):  # staged: every rank's shard is in place once all arrive
            dist.barrier(group=self.group)
            return
        self._claim_work()
        slots, n = self._work_rows(shard.dtype, self.world), shard.numel()
        shard, gathered = shard.reshape(-1), output.view(self.world, n)
        for start in range(0, n, slots.shape[1]):
            end = min(n, start + slots.shape[1])
            slots[self.rank, : end - start].copy_(shard[start:end])
            dist.barrier(group=self.group)
            gathered[:, start:end].copy_(slots[:, : end - start])
            dist.barrier(group=self.group)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor) -> None:
        """``output`` = the sum over ranks of their ``full``'s ``rank``-th part (``full``: ``world`` parts)."""
        n, mine = output.numel(), output.view(-1)
        if self._within(full, self.work_offset, self.buffer.numel()):  # staged in this rank's segment
            dist.barrier(group=self.group)
            start = self.work_offset
            parts = [
                self._view(start + j * self.segment_bytes + self.rank * n * _size(full.dtype), n, full.dtype)
                for j in range(self.world)
            ]
            torch.add(parts[0], parts[1], out=mine)
            for part in parts[2:]:
                mine.add_(part)
            self.work_read_after_return = True  # the others may still be reading this rank's segment
            return
        self._claim_work()
        regions = self._work_rows(full.dtype, self.world * self.world).view(self.world, self.world, -1)
        parts = full.view(self.world, n)  # regions: [writer, reader, elements]
        for start in range(0, n, regions.shape[2]):
            end = min(n, start + regions.shape[2])
            regions[self.rank, :, : end - start].copy_(parts[:, start:end])
            dist.barrier(group=self.group)
            torch.sum(regions[:, self.rank, : end - start], dim=0, out=mine[start:end])
            dist.barrier(group=self.group)

    # ---------------------------------------------------------------------------------------------------

    def _claim_work(self) -> None:
        """Wait until no rank reads the working area any more (every rank calls this at the same points)."""
        if self.work_read_after_return:
            dist.barrier(group=self.group)
            self.work_read_after_return = False

    def _view(self, offset_bytes: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.buffer[offset_bytes : offset_bytes + numel * _size(dtype)].view(dtype)

    def _work_rows(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """The working area as ``count`` equal rows of ``dtype`` elements."""
        elements = self.work_bytes // _size(dtype) // count
        return self._view(self.work_offset, count * elements, dtype).view(count, elements)

    def _within(self, tensor: torch.Tensor, start: int, end: int) -> bool:
        return self.buffer.data_ptr() + start <= tensor.data_ptr() < self.buffer.data_ptr() + end


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _create(size: int) -> str | None:
    """A new file of ``size`` bytes under /dev/shm, its pages reserved (so that a full /dev/shm fails here, not
    with SIGBUS on a later write); None when it cannot be made."""
    path = os.path.join(SHM_ROOT, f"openrft-fsdp-{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
        return path
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


def _numel(size: Sequence[int | torch.SymInt]) -> int:
    return math.prod(int(s) for s in size)


class SharedAllGather(AllGather):
    def __init__(self, exchange: SharedExchange):
        self.exchange = exchange

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        staged = self.exchange.gather_staging(_numel(size), dtype)
        return staged.view(*size) if staged is not None else torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False) -> None:
        self.exchange.all_gather(output_tensor, input_tensor)


class SharedReduceScatter(ReduceScatter):
    """FSDP2 allocates a reduce-scatter's input, then its output: the input is staged in the buffer."""

    def __init__(self, exchange: SharedExchange):
        self.exchange = exchange
        self.next_is_input = True

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        staged = self.exchange.scatter_staging(_numel(size), dtype) if self.next_is_input else None
        self.next_is_input = not self.next_is_input
        return staged.view(*size) if staged is not None else torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False) -> None:
        self.next_is_input = True
        if op != dist.ReduceOp.SUM:
            raise NotImplementedError(f"shared-memory reduce-scatter sums; FSDP asked for {op}")
        self.exchange.reduce_scatter(output_tensor, input_tensor)


def use_shared_memory(units: Sequence[torch.nn.Module], exchange: SharedExchange) -> None:
    """Route the FSDP ``units``' all-gathers and reduce-scatters through ``exchange``."""
    for unit in units:
        unit.set_custom_all_gather(SharedAllGather(exchange))
        unit.set_custom_reduce_scatter(SharedReduceScatter(exchange))
