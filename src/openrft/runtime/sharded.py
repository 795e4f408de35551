"""One rank of a sharded learner (``rollout.learner_sharding: fsdp``), as a Ray actor or a torchrun process.

Every rank holds a shard of the policy (``openrft.learner.sharded``) and answers the same calls in the
same order, since most of them are collectives: a step, a checkpoint's state, the gathered weights.
Rank 0 also generates (evaluation, synchronous rollouts): the others only take part in gathering the
parameters for it, then release them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.runtime.process_group import free_port, join_process_group, node_address
from openrft.spec.job import JobSpec


class ShardedWorker:
    """Builds the model, joins the process group, shards the policy; then serves the learner's calls."""

    def __init__(self, spec_json: str):
        self.spec = JobSpec.model_validate_json(spec_json)
        self.learner = None

    def pid(self) -> int:
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """Where rank 0 (this actor) listens for the process group: this node's address and a free port."""
        return node_address(), free_port()

    def setup(self, rank: int, world_size: int, address: str | None, port: int | None) -> int:
        """Join the group (``address`` None: torchrun's environment), load and shard the model; its version."""
        from openrft.engine.local_runtime import learner_config
        from openrft.learner.sharded import ShardedLearner, ShardedPolicy
        from openrft.models import configure_threads, eos_token_ids, load_causal_lm, load_tokenizer, pick_dtype
        from openrft.rollout.local import TransformersGenerator

        spec = self.spec
        configure_threads(spec.runtime.threads or 1)
        device = sharded_device(spec.runtime.device)
        join_process_group(rank, world_size, address, port, device)
        tokenizer = load_tokenizer(spec.model.name_or_path, spec.model.revision)
        torch.manual_seed(spec.training.seed)  # as one learner: the same adapter initialisation on every rank
        model = load_causal_lm(
            spec.model.name_or_path, device, pick_dtype(spec.model.dtype, device), spec.model.revision
        )
        offload = spec.rollout.learner_offload == "cpu"
        self.policy = ShardedPolicy(model, spec.lora, spec.algorithm.kl_loss_coef > 0, device, offload)
        self.learner = ShardedLearner(self.policy, learner_config(spec, tokenizer.pad_token_id))
        self.generator = TransformersGenerator(
            self.policy.model,
            tokenizer,
            eos_token_ids(tokenizer, model),
            tokenizer.pad_token_id,
            seed=spec.training.seed,
        )
        return self.learner.version

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def version(self) -> int:
        return self.learner.version

    def use_kl(self) -> bool:
        return self.learner.use_kl

    def step(self, samples: list) -> tuple[dict[str, float], int]:
        """One step on this rank's share of the whole batch ``samples`` (``ShardedLearner.step``)."""
        metrics = self.learner.step(samples)
        self.generator.set_policy_version(self.learner.version)
        return metrics, self.learner.version

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> int:
        self.learner.load_state_dict(state)
        self.generator.set_policy_version(self.learner.version)
        return self.learner.version

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The gathered policy weights on rank 0 (adapter with LoRA, the full model without); empty elsewhere."""
        return self.policy.adapter_state(keep=self.rank == 0)

    def adapter_files(self) -> dict[str, bytes]:
        """The policy in PEFT format (LoRA) or Hugging Face format (full), as files, from rank 0."""
        from openrft.rollout.remote import write_peft_adapter

        state = self.policy.adapter_state(keep=self.rank == 0)
        if self.rank != 0:
            return {}
        with tempfile.TemporaryDirectory() as tmp:
            if self.policy.lora_enabled:
                write_peft_adapter(state, self.spec.lora, self.spec.model.name_or_path, Path(tmp))
            else:
                self.policy.model.save_pretrained(tmp, state_dict=state)
            return {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None) -> list[list[Completion]]:
        """Rank 0 samples with the gathered parameters; the other ranks only help gather them."""
        with self.policy.gathered():
            if self.rank != 0:
                return []
            return self.generator.generate(prompts, params, seed=seed)


def sharded_device(name: str) -> torch.device:
    """The device of this rank: its own GPU (``LOCAL_RANK`` under torchrun, Ray's assignment) or the CPU."""
    from openrft.models import pick_device

    device = pick_device(name)
    if device.type == "cuda" and device.index is None:
        index = int(os.environ.get("LOCAL_RANK", 0)) if "LOCAL_RANK" in os.environ else 0
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    return device


def merge_states(states: list[dict]) -> dict:
    """One checkpoint state from every rank's: rank 0's with the files of all (each rank writes its shard's)."""
    merged = dict(states[0])
    merged["files"] = {name: data for state in states for name, data in state["files"].items()}
    merged["learners"] = len(states)
    return merged


class ShardedEvalGenerator(PolicyVersioned):
    """Generation on rank 0 with the gathered parameters (every rank takes part in the gathering)."""

    def __init__(self, learner):
        self.learner = learner
        self.rng = torch.Generator()

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        return self.learner.call("generate", prompts, params, seed)[0]
