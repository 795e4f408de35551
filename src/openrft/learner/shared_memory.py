"""FSDP2's all-gather and reduce-scatter through shared memory, for CPU learners on one host.

Gloo moves a collective's bytes through loopback TCP. On this project's 2-core machine an all-gather of one
decoder block's 30 MB shards took about 150 ms, and the sharded step gathered every block four times and
reduce-scattered its gradient twice (twice and once since passes are packed, ``learner/packed.py``), so
most of a 2-learner step was spent in gloo (benchmarks/results/sharding.md). Processes on one host can
instead exchange through one shared buffer (as DeepSpeed's and vLLM's CPU backends do): each rank copies its
part into its own slot, waits at a barrier (a gloo collective of a few bytes), reads what it needs from
every slot, and waits again before the slots are reused. The buffer has a fixed size (``budget_bytes``); a
larger tensor goes through it in chunks.

``SharedExchange.open`` returns None when a rank cannot see the buffer rank 0 made (another host, another
container, a ``/dev/shm`` too small); FSDP then keeps gloo. ``OPENRFT_FSDP_TRANSPORT=gloo`` keeps gloo too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from openrft.learner.buffer_pool import BufferPool

SHM_ROOT = "/dev/shm"
BUDGET_BYTES = 128 * 2**20
TRANSPORT_VARIABLE = "OPENRFT_FSDP_TRANSPORT"


class SharedExchange:
    """A shared-memory buffer mapped by every rank of ``group``, and the two collectives FSDP runs through it."""

    def __init__(self, group: dist.ProcessGroup, buffer: torch.Tensor):
        self.group, self.buffer = group, buffer
        self.pool = BufferPool()  # the collectives' own buffers, reused (``learner/buffer_pool.py``)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    @classmethod
    def open(cls, group: dist.ProcessGroup | None = None, budget_bytes: int = BUDGET_BYTES) -> SharedExchange | None:
        """Every rank of ``group`` maps one new ``/dev/shm`` file of ``budget_bytes`` (a collective: all ranks
        call it); None on every rank when one of them cannot. The file is unlinked once all have mapped it and
        before any rank returns, so nothing is left behind whatever happens to the processes."""
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
        dist.barrier(group=group)  # no rank returns while the file still has a name
        return cls(group, buffer) if int(mapped) == 1 else None

    def _slots(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """The buffer as ``count`` equal rows of ``dtype`` elements."""
        elements = self.buffer.numel() // torch.empty((), dtype=dtype).element_size() // count
        return self.buffer.view(dtype)[: count * elements].view(count, elements)

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        """``output`` (``world`` x ``shard``'s elements) = every rank's ``shard``, in rank order."""
        slots, n = self._slots(shard.dtype, self.world), shard.numel()
        shard, gathered = shard.reshape(-1), output.view(self.world, n)
        for start in range(0, n, slots.shape[1]):
            end = min(n, start + slots.shape[1])
            slots[self.rank, : end - start].copy_(shard[start:end])
            dist.barrier(group=self.group)
            gathered[:, start:end].copy_(slots[:, : end - start])
            dist.barrier(group=self.group)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor) -> None:
        """``output`` = the sum over ranks of their ``full``'s ``rank``-th part (``full``: ``world`` parts)."""
        n = output.numel()
        regions = self._slots(full.dtype, self.world * self.world)
        regions = regions.view(self.world, self.world, -1)  # [writer, reader, elements]
        parts, mine = full.view(self.world, n), output.view(-1)
        for start in range(0, n, regions.shape[2]):
            end = min(n, start + regions.shape[2])
            regions[self.rank, :, : end - start].copy_(parts[:, start:end])
            dist.barrier(group=self.group)
            torch.sum(regions[:, self.rank, : end - start], dim=0, out=mine[start:end])
            dist.barrier(group=self.group)


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


class PooledBuffers:
    """FSDP2's custom-collective ``allocate``, served by the exchange's ``BufferPool``."""

    def __init__(self, exchange: SharedExchange):
        self.exchange = exchange

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.exchange.pool.allocate(size, dtype=dtype, device=device)


class SharedAllGather(PooledBuffers, AllGather):
    def __call__(self, output_tensor, input_tensor, group, async_op=False) -> None:
        self.exchange.all_gather(output_tensor, input_tensor)


class SharedReduceScatter(PooledBuffers, ReduceScatter):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False) -> None:
        if op != dist.ReduceOp.SUM:
            raise NotImplementedError(f"shared-memory reduce-scatter sums; FSDP asked for {op}")
        self.exchange.reduce_scatter(output_tensor, input_tensor)


def use_shared_memory(units: Sequence[torch.nn.Module], exchange: SharedExchange) -> None:
    """Route the FSDP ``units``' all-gathers and reduce-scatters through ``exchange``."""
    for unit in units:
        unit.set_custom_all_gather(SharedAllGather(exchange))
        unit.set_custom_reduce_scatter(SharedReduceScatter(exchange))
