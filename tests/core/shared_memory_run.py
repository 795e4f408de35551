"""Run by tests/core/test_shared_memory.py under ``torchrun``: the shared-memory all-gather and reduce-scatter
against gloo's on the same tensors, through a buffer small enough that every tensor goes in several chunks
(the last one short); rank 0 writes what the test checks."""

import json
import os
import sys

import torch
import torch.distributed as dist

from openrft.learner.shared_memory import SHM_ROOT, SharedExchange

BUDGET = 4096  # bytes: a few hundred elements a chunk


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    before = set(os.listdir(SHM_ROOT))
    exchange = SharedExchange.open(budget_bytes=BUDGET)
    left = sorted(set(os.listdir(SHM_ROOT)) - before)
    errors = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for n in (1, 37, 1000, 5003):
            g = torch.Generator().manual_seed(1000 * rank + n)
            shard = torch.randn(n, generator=g).to(dtype)
            full = torch.randn(world * n, generator=g).to(dtype)
            expected_gather, got_gather = torch.empty(world * n, dtype=dtype), torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(expected_gather, shard)
            exchange.all_gather(got_gather, shard)
            expected_sum, got_sum = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(expected_sum, full.clone())
            exchange.reduce_scatter(got_sum, full)
            errors[f"{dtype} {n}"] = {
                "gather": float((got_gather.double() - expected_gather.double()).abs().max()),
                "sum": float((got_sum.double() - expected_sum.double()).abs().max()),
                "sum_scale": float(expected_sum.double().abs().max()),
            }
    every = [None] * world
    dist.all_gather_object(every, {"errors": errors, "left": left})
    os.environ["OPENRFT_FSDP_TRANSPORT"] = "gloo"
    refused = SharedExchange.open(budget_bytes=BUDGET)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"ranks": every, "world": world, "gloo_variable_refused": refused is None}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
