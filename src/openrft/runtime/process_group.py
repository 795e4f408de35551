"""The process group of a job's learner processes: sharded learners (FSDP, on Ray or torchrun) and data-parallel
learners on Ray, which sum their gradients in it. Rank 0 gives its node's address and a free port; gloo carries CPU
tensors, NCCL CUDA ones."""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a rank waits in a collective for the others; a dead peer usually fails it sooner (gloo/NCCL)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_address() -> str:
    """This node's address as the other learners reach it (``OPENRFT_MASTER_ADDR`` overrides)."""
    if os.environ.get("OPENRFT_MASTER_ADDR"):
        return os.environ["OPENRFT_MASTER_ADDR"]
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # a Ray actor (or driver): the node's address on the cluster
        return ray.util.get_node_ip_address()
    return "127.0.0.1"  # learner processes of this machine (local_parallel)


def join_process_group(rank: int, world_size: int, address: str | None, port: int | None, device: torch.device) -> None:
    """Join the group at ``address:port`` (None: torchrun's environment), unless this process is in one already."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    init = f"tcp://{address}:{port}" if address else "env://"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Make every rank's ``.grad`` of ``params`` the sum over the group (zeros where none flowed), one all-reduce of
    one flat buffer per dtype. Every rank ends with the same bits: each element's sum is computed once and sent."""
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        by_dtype.setdefault(param.grad.dtype, []).append(param)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        for param, part in zip(group, flat.split([p.numel() for p in group]), strict=True):
            param.grad = part.view_as(param)
