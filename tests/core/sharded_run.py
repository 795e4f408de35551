"""Run by tests/core/test_sharded.py under ``torchrun --nproc-per-node 2``: a sharded learner takes two
steps on a fixed batch for each job spec in a directory; rank 0 writes what the test compares."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from openrft.runtime.sharded import ShardedWorker
from tests.core.test_sharded import batch


def main(spec_dir: Path, out: Path) -> None:
    for mode in sorted(p.stem for p in spec_dir.glob("*.json")):
        worker = ShardedWorker((spec_dir / f"{mode}.json").read_text())
        worker.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, None)  # torchrun's group
        results = {"metrics": [worker.step(batch(mode))[0]], "step1": worker.adapter_state()}
        state = worker.state_dict()
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, state)
        results["metrics"].append(worker.step(batch(mode))[0])
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
