"""Where a job's learner and generation replicas run. ``LocalRuntime``: all in this process.

A runtime builds the learner (with the model that checkpoints save and a generator for evaluation)
and the generation replicas of asynchronous jobs; ``openrft.runtime`` adds the Ray runtime, which
places them on Ray actors. The engine only sees this protocol.

In-process replicas are threads, each with a copy of the policy model that **shares the frozen
base weights** with the learner and owns its adapter weights (LoRA): the extra memory per replica
is one adapter plus small buffers, not a model. Without LoRA every weight is trainable, so each
replica is a full copy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from openrft.engine.async_rollouts import REPLICA_SEED_STRIDE, GenerationReplica
from openrft.engine.setup import JobParts
from openrft.learner import Learner, LearnerConfig, Policy
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.replicas import GeneratorReplica
from openrft.rollout.sync_probe import ProbeSet, score_with_model
from openrft.spec.job import JobSpec, RolloutCorrectionSpec


@dataclass
class LearnerParts:
    learner: Any  # Learner, or a proxy with step / version / state_dict / load_state_dict
    model: Any  # what checkpoints save: a PeftModel, or an object with save_pretrained(directory)
    generator: Any  # evaluation (and synchronous rollouts): a Generator with an ``rng``
    adapter_state: Callable[[], Any]  # the current policy's weights, as the runtime broadcasts them
    probe_scores: Callable[[ProbeSet], list[list[float]]] | None = None  # the learner's sync-probe scores
    processes: int = 1  # learner processes of this machine a phase may run on (runtime/local_parallel.py)
    use_processes: Callable[[str, int], None] | None = None  # tells the runtime how many the next phase uses
    release_processes: Callable[[], None] | None = None  # ends them once every phase keeps the job's process alone
    when_processes_lost: Callable[[Callable[[], None]], None] | None = None  # registers what to do once one ends


class AdapterFilesWriter:
    """What checkpoints save (``save_pretrained``): files made elsewhere (a learner actor's, or the gathered
    sharded policy's: PEFT, or Hugging Face for full fine-tuning), written here."""

    def __init__(self, files: Callable[[], dict[str, bytes]]):
        self.files = files

    def save_pretrained(self, directory: str) -> None:
        for name, data in self.files().items():
            path = Path(directory) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


class Runtime(Protocol):
    name: str
    loads_model_locally: bool  # whether the job's process needs the model itself

    def build_learner(self, spec: JobSpec, parts: JobParts) -> LearnerParts: ...

    def generation_replicas(
        self, spec: JobSpec, parts: JobParts, learner: LearnerParts, run_dir: Path
    ) -> list[GenerationReplica]: ...

    def close(self) -> None: ...


def learner_config(spec: JobSpec, pad_token_id: int) -> LearnerConfig:
    return LearnerConfig(
        algorithm=spec.algorithm,
        optimizer=spec.optimizer,
        lora=spec.lora,
        temperature=spec.sampling.temperature,
        micro_batch_tokens=spec.training.micro_batch_tokens,
        pad_token_id=pad_token_id,
        importance_weight_cap=spec.rollout.importance_weight_cap,
        activation_checkpointing=spec.training.activation_checkpointing,
        top_k=spec.sampling.top_k,
        top_p=spec.sampling.top_p,
        min_p=spec.sampling.min_p,
        correction=correction_config(spec),
    )


def correction_config(spec: JobSpec) -> RolloutCorrectionSpec | None:
    """The rollout correction with its mode resolved (``auto`` -> tis or off), None when off."""
    mode = spec.rollout.correction_mode
    return None if mode == "off" else spec.rollout.correction.model_copy(update={"mode": mode})


def shared_base_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose frozen parameters are the original's own tensors (not copied)."""
    memo = {id(p): p for p in model.parameters() if not p.requires_grad}
    return copy.deepcopy(model, memo)


def replica_seed(seed: int, index: int) -> int:
    return seed + index * REPLICA_SEED_STRIDE


def remote_replicas(spec: JobSpec, parts: JobParts, run_dir: Path) -> list[GenerationReplica]:
    """Replicas that sample from OpenAI/vLLM-compatible servers (``rollout.generator_base_url``, a list:
    replica ``i`` uses server ``i mod len``)."""
    from openrft.rollout.remote import RemoteGenerator

    urls = spec.rollout.generator_base_url or []
    return [
        GeneratorReplica(
            RemoteGenerator(
                urls[i % len(urls)],
                adapter_dir=run_dir / "served_adapters" / f"replica-{i}",
                lora=spec.lora,
                base_model=spec.model.name_or_path,
                eos_token_ids=parts.eos_ids,
                adapter_prefix=f"{spec.name}-r{i}",
            ),
            name=f"remote-{i}",
        )
        for i in range(spec.rollout.generation_replicas)
    ]


def colocated_vllm(spec: JobSpec, parts: JobParts, run_dir: Path):
    """vLLM's ``LLM`` engine in this process (``rollout.engine: vllm``); refused by name without vLLM."""
    from openrft.models import resolve_model_path
    from openrft.rollout.vllm_local import VllmGenerator

    return VllmGenerator(
        str(resolve_model_path(spec.model.name_or_path)),
        adapter_dir=run_dir / "served_adapters" / "vllm",
        lora=spec.lora,
        eos_token_ids=parts.eos_ids,
        max_model_len=spec.sampling.max_length,
        dtype="bfloat16" if torch.cuda.is_available() else "float32",
        seed=spec.training.seed,
    )


class LocalRuntime:
    """The learner in this process; generation replicas as threads (or clients of remote servers)."""

    name = "local"
    loads_model_locally = True

    def build_learner(self, spec: JobSpec, parts: JobParts, sharers: int = 1) -> LearnerParts:
        """``sharers``: processes of this machine that hold a learner each, sharing its memory."""
        policy = Policy(parts.model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
        learner = Learner(policy, learner_config(spec, parts.tokenizer.pad_token_id), memory_sharers=sharers)
        generator = TransformersGenerator(
            policy.model, parts.tokenizer, parts.eos_ids, parts.tokenizer.pad_token_id, seed=spec.training.seed
        )
        self._policy = policy
        return LearnerParts(
            learner, policy.model, generator, policy.adapter_state, lambda probe: score_with_model(policy.model, probe)
        )

    def generation_replicas(
        self, spec: JobSpec, parts: JobParts, learner: LearnerParts, run_dir: Path
    ) -> list[GenerationReplica]:
        if spec.rollout.generator_base_url:
            return remote_replicas(spec, parts, run_dir)
        if spec.rollout.generation_engine == "vllm":
            return [GeneratorReplica(colocated_vllm(spec, parts, run_dir), "vllm")]
        replicas: list[GenerationReplica] = []
        for i in range(spec.rollout.generation_replicas):
            model = shared_base_copy(learner.model)
            generator = TransformersGenerator(model, parts.tokenizer, parts.eos_ids, parts.tokenizer.pad_token_id)
            replicas.append(
                GeneratorReplica(FullWeightsLoader(generator), f"thread-{i}", replica_seed(spec.training.seed, i))
            )
        return replicas

    def close(self) -> None:
        return None


class FullWeightsLoader:
    """A TransformersGenerator whose ``load_adapter`` also takes full weights (no LoRA)."""

    def __init__(self, generator: TransformersGenerator):
        self.generator = generator
        self.rng = generator.rng

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> None:
        from peft import PeftModel

        if isinstance(self.generator.model, PeftModel):
            self.generator.load_adapter(weights, version)
        else:
            self.generator.model.load_state_dict(weights)
            self.generator.set_policy_version(version)

    def generate(self, prompts, params, seed=None):
        return self.generator.generate(prompts, params, seed)

    def score(self, probe):
        return self.generator.score(probe)

    @property
    def probe_engine(self) -> tuple[str, str]:
        return self.generator.probe_engine

    @property
    def policy_version(self) -> int:
        return self.generator.policy_version
