"""Run by tests/core/test_sharded.py under ``torchrun --nproc-per-node N``: a sharded learner takes two
steps on a fixed batch for each job spec in a directory; rank 0 writes what the test compares. A spec named
``resumed-<mode>`` resumes instead the checkpoint of ``<mode>`` in the third argument (a directory of such
results) and takes one step from it."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from openrft.learner import packed
from openrft.learner.shared_memory import TRANSPORT_VARIABLE
from openrft.runtime.sharded import ShardedWorker
from tests.core.test_sharded import GLOO_RUNS, MODES, RESUMED, UNPACKED_RUNS, batch

PACKED_MASK_BYTES = packed.MAX_MASK_BYTES


def count_gathered_blocks(worker: ShardedWorker) -> list[int]:
    """Before each block's forward, how many blocks hold gathered (not sharded) parameters."""
    blocks = worker.policy.blocks
    counts: list[int] = []

    def gathered(*_):
        counts.append(sum(not isinstance(next(b.parameters()), DTensor) for b in blocks))

    for block in blocks:
        block.register_forward_pre_hook(gathered)
    return counts


def local_numel(param: torch.Tensor) -> int:
    return (param.to_local() if isinstance(param, DTensor) else param).numel()


def all_ranks(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def main(spec_dir: Path, out: Path, resume: Path | None) -> None:
    for mode in sorted(p.stem for p in spec_dir.glob("*.json")):
        if mode in GLOO_RUNS:  # the blocks' collectives through gloo, the others through shared memory
            os.environ[TRANSPORT_VARIABLE] = "gloo"
        else:
            os.environ.pop(TRANSPORT_VARIABLE, None)
        packed.MAX_MASK_BYTES = 0 if mode in UNPACKED_RUNS else PACKED_MASK_BYTES  # prompt pass + continuation
        worker = ShardedWorker((spec_dir / f"{mode}.json").read_text())
        worker.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, None)  # torchrun's group
        original = mode.removeprefix(RESUMED)
        if original in MODES:  # the LM head over chunks of one token (vocabulary-parallel, sharded)
            worker.learner.config.logits_chunk_bytes = 1
        if mode != original:
            worker.load_state_dict(torch.load(resume / f"{original}.pt", weights_only=False)["checkpoint"])
            worker.step(batch(original))
            state = worker.adapter_state()
            if dist.get_rank() == 0:
                torch.save({"step2": state}, out / f"{mode}.pt")
            continue
        learner = worker.learner
        passes = all_ranks(len(learner.plan(learner.share(batch(mode)))))
        counts = count_gathered_blocks(worker)
        results = {"metrics": [worker.step(batch(mode))[0]], "step1": worker.adapter_state()}
        results["passes"], results["most_gathered_blocks"] = passes, max(all_ranks(max(counts)))
        results["blocks"] = len(worker.policy.blocks)
        results["transport"] = worker.policy.transport
        results["packed_passes"] = all_ranks(learner.packed_passes)
        group = worker.policy.blocks[0]._get_fsdp_state()._fsdp_param_group
        results["offloaded"] = all(p.offload_to_cpu for p in group.fsdp_params)
        reference = worker.policy._reference_model
        if reference is not None:  # a full fine-tune's: sharded like the policy
            params = list(reference.parameters())
            results["reference_numel"] = all_ranks(sum(p.numel() for p in params))
            results["reference_local_numel"] = all_ranks(sum(local_numel(p) for p in params))
        states = all_ranks(worker.state_dict())
        results["metrics"].append(worker.step(batch(mode))[0])
        results["step2"] = worker.adapter_state()
        files = worker.adapter_files()
        if dist.get_rank() == 0:
            checkpoint = dict(states[0])
            checkpoint["files"] = {name: data for s in states for name, data in s["files"].items()}
            results["checkpoint"], results["files"] = checkpoint, files
            torch.save(results, out / f"{mode}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    dist.destroy_process_group()
