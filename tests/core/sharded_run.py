"""Run by tests/core/test_sharded.py under ``torchrun --nproc-per-node 2``: a sharded learner takes two
steps on a fixed batch, LoRA then full fine-tuning; rank 0 writes what the test compares."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from openrft.runtime.sharded import ShardedWorker
from tests.core.test_data_parallel import _samples


def main(spec_dir: Path, out: Path) -> None:
    for mode in ("lora", "full"):
        worker = ShardedWorker((spec_dir / f"{mode}.json").read_text())
        worker.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, None)  # torchrun's group
        samples = _samples()
        share = worker.learner.share(samples)
        total = sum(len(s.response_ids) for s in samples)
        results = {"metrics": [worker.step(share, total)[0]], "step1": worker.adapter_state()}
        state = worker.state_dict()
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, state)
        results["metrics"].append(worker.step(share, total)[0])
        results["step2"] = worker.adapter_state()
        files = worker.adapter_files()
        if dist.get_rank() == 0:
            checkpoint = dict(states[0])
            checkpoint["files"] = {name: data for s in states for name, data in s["files"].items()}
            results["checkpoint"], results["files"] = checkpoint, files
            torch.save(results, out / f"{mode}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    dist.destroy_process_group()
