"""The sharded learner without Ray: ``torchrun --nproc-per-node N $(which openrft) train JOB`` on one box.

Every process is a rank of the sharded learner (``ShardedWorker``). Rank 0 runs the job (the loop,
rewards, checkpoints, evaluation) with ``TorchrunRuntime``; the other ranks only follow: rank 0 sends
each learner call (a step, a checkpoint's state, gathered weights, a generation's gathering) to them
over a gloo group, and all ranks run it together. If any process fails, torchrun stops the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from openrft.engine.local_runtime import AdapterFilesWriter, LearnerParts, remote_replicas
from openrft.engine.setup import JobParts
from openrft.errors import OpenRFTError
from openrft.runtime.process_group import COLLECTIVE_TIMEOUT
from openrft.runtime.sharded import ShardedEvalGenerator, ShardedWorker, merge_states
from openrft.spec.job import JobSpec

GATHERED = {"state_dict"}  # calls whose every rank's result rank 0 needs
STOP = "stop"


def torchrun_world() -> int:
    """Processes torchrun started for this job (1 when not under torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_follower() -> bool:
    """A torchrun rank other than 0: it serves the learner calls of rank 0's job."""
    return torchrun_world() > 1 and int(os.environ.get("RANK", "0")) > 0


def _join():
    """Join torchrun's process group (CUDA tensors over NCCL where there are GPUs, CPU tensors over gloo)
    and a gloo group for the calls."""
    import torch

    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)


def follow() -> int:
    """A follower's life: receive the spec, build its shard, run every call rank 0 sends until it stops."""
    control = _join()
    message: list[Any] = [None]
    dist.broadcast_object_list(message, src=0, group=control)
    worker = ShardedWorker(message[0])
    worker.setup(dist.get_rank(), dist.get_world_size(), None, None)
    while True:
        dist.broadcast_object_list(message, src=0, group=control)
        method, args = message[0]
        if method == STOP:
            break
        result = getattr(worker, method)(*args)
        if method in GATHERED:
            dist.gather_object(result, None, dst=0, group=control)
    dist.destroy_process_group()
    return 0


class TorchrunLearner:
    """Rank 0's learner: every call is sent to the followers and run here too, in the same order."""

    def __init__(self, spec: JobSpec):
        self.control = _join()
        dist.broadcast_object_list([spec.model_dump_json()], src=0, group=self.control)
        self.worker = ShardedWorker(spec.model_dump_json())
        self.world_size = dist.get_world_size()
        self.version = self.worker.setup(0, self.world_size, None, None)
        self.use_kl = self.worker.use_kl()

    def call(self, method: str, *args: Any) -> list:
        """Run ``method`` on every rank; rank 0's result (every rank's for ``GATHERED`` calls)."""
        dist.broadcast_object_list([(method, args)], src=0, group=self.control)
        result = getattr(self.worker, method)(*args)
        if method not in GATHERED:
            return [result]
        results: list[Any] = [None] * self.world_size
        dist.gather_object(result, results, dst=0, group=self.control)
        return results

    def step(self, samples: list) -> dict[str, float]:
        metrics, self.version = self.call("step", samples)[0]
        return metrics

    def state_dict(self) -> dict:
        return merge_states(self.call("state_dict"))

    def load_state_dict(self, state: dict) -> None:
        self.version = self.call("load_state_dict", state)[0]

    def adapter_state(self):
        return self.call("adapter_state")[0]

    def adapter_files(self) -> dict[str, bytes]:
        return self.call("adapter_files")[0]

    def stop(self) -> None:
        if dist.is_initialized():
            dist.broadcast_object_list([(STOP, ())], src=0, group=self.control)
            dist.destroy_process_group()


class TorchrunRuntime:
    """Rank 0's runtime (``rollout.runtime: local`` under torchrun with ``learner_sharding: fsdp``); the number
    of learners is torchrun's number of processes, so a run resumes on another number of them."""

    name = "local"
    loads_model_locally = False

    def __init__(self, spec: JobSpec):
        self._learner: TorchrunLearner | None = None  # the learners: torchrun's processes (not rollout.replicas)

    def build_learner(self, spec: JobSpec, parts: JobParts) -> LearnerParts:
        self._learner = learner = TorchrunLearner(spec)
        writer, evaluation = AdapterFilesWriter(learner.adapter_files), ShardedEvalGenerator(learner)
        return LearnerParts(learner, writer, evaluation, learner.adapter_state)

    def generation_replicas(self, spec: JobSpec, parts: JobParts, learner: LearnerParts, run_dir: Path) -> list:
        if spec.rollout.generator_base_url:
            return remote_replicas(spec, parts, run_dir)
        if spec.rollout.generation_engine == "vllm":
            raise OpenRFTError(
                "rollout.engine 'vllm' (vLLM in the learner's process) does not run under torchrun (a sharded "
                "learner): serve vLLM and set rollout.generator_base_url"
            )
        raise OpenRFTError(
            "rollout.strategy off_policy_async under torchrun needs generation servers (rollout.generator_base_url): "
            "in-process replicas would each need the whole model in rank 0's process; or use rollout.runtime ray"
        )

    def close(self) -> None:
        if self._learner is not None:
            self._learner.stop()
