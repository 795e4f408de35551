"""The Ray runtime (``rollout.runtime: ray``): the learner and the generation replicas are Ray actors.

- One placement group holds a bundle per learner (``rollout.replicas``) and one per generation
  actor (``rollout.generation_replicas``, where the job starts them: ``generation_actors``), one CPU each
  (``runtime.threads`` CPUs when set) and one GPU each when the cluster has enough; the job waits for it
  and fails with the missing resources named.
- Several learners are data-parallel (``learner_group.GroupLearner``): each takes a share of the batch, they sum their
  gradients among themselves (gloo, or NCCL on GPUs), and every learner applies the sum, so they stay
  identical; a step is one call to each learner.
- Synchronous rollouts from the local engine are sampled by the learners themselves, each a share of the
  prompts (``learner_group.GroupGenerator``): no weights move, and N learners use N processes for both phases.
- The first learner actor also evaluates. With generation actors, after each update its adapter state is
  returned by an actor call, so the weights go into Ray's object store once and every replica
  fetches them from there by reference (adapter weights only with LoRA, never the base model).
- A replica whose actor dies is replaced in its bundle, given the adapter it was serving, and its
  in-flight generation call is issued again with the same random stream (so the result is the same).
- The job's own process keeps the loop, the rewards, the metrics and the checkpoints; it reads the
  adapter files from the learner for checkpoints, so no shared filesystem is needed.

``rollout.ray_address``, or the operator's cluster in the service (``openrft serve --ray-address``, passed by
``runtime_for``), connects to an existing cluster (``auto``, ``ray://host:10001``, ...); without either a Ray
instance is started for the job and shut down after. Every node needs OpenRFT installed. The bundles come
from ``placement.bundles``, which the service also shows on the job before it starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openrft.calls.credentials import ray_worker_env
from openrft.engine.async_rollouts import GenerationReplica
from openrft.engine.local_runtime import (
    AdapterFilesWriter,
    LearnerParts,
    remote_replicas,
    replica_seed,
)
from openrft.engine.setup import JobParts
from openrft.errors import OpenRFTError
from openrft.rollout.types import Completion, SamplingParams
from openrft.runtime.cluster_address import init_ray, unreachable
from openrft.runtime.learner_group import GroupGenerator, GroupLearner, LearnerActor, load_model
from openrft.runtime.placement import RAY_NAMESPACE, bundles
from openrft.spec.job import JobSpec

PLACEMENT_TIMEOUT_S = 120.0
MAX_REPLICA_RESTARTS = 5


class GenerationActor:
    """A generation replica: its own copy of the base model, the policy's adapter loaded by version."""

    def __init__(self, spec_json: str, seed: int):
        from peft import get_peft_model

        from openrft.learner.lora_fused import fuse_lora_linears
        from openrft.learner.policy import POLICY_ADAPTER, lora_config
        from openrft.rollout.local import TransformersGenerator

        spec = JobSpec.model_validate_json(spec_json)
        model, tokenizer, eos = load_model(spec)
        if spec.lora.enabled:
            model = get_peft_model(model, lora_config(spec.lora), adapter_name=POLICY_ADAPTER)
            fuse_lora_linears(model)
        self.lora = spec.lora.enabled
        self.generator = TransformersGenerator(model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> int:
        if self.lora:
            self.generator.load_adapter(weights, version)
        else:
            self.generator.model.load_state_dict(weights)
            self.generator.set_policy_version(version)
        return os.getpid()

    def score(self, probe) -> list[list[float]]:
        return self.generator.score(probe)

    def probe_engine(self) -> tuple[str, str]:
        return self.generator.probe_engine

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, rng_state: torch.Tensor | None
    ) -> tuple[list[list[Completion]], torch.Tensor]:
        if rng_state is not None:
            self.generator.rng.set_state(rng_state)
        groups = self.generator.generate(prompts, params)
        return groups, self.generator.rng.get_state()

    def pid(self) -> int:
        return os.getpid()


class RayReplica:
    """A generation replica on a ``GenerationActor``; replaced (and its call re-issued) if it dies."""

    def __init__(
        self,
        start: Callable[[], Any],
        name: str,
        on_event: Callable[[str, str], None],
        max_restarts: int = MAX_REPLICA_RESTARTS,
    ):
        self.start, self.name, self.on_event, self.max_restarts = start, name, on_event, max_restarts
        self.actor = start()
        self.restarts = 0
        self._adapter: tuple[Any, int] | None = None

    def load_adapter(self, weights: Any, version: int) -> None:
        self._adapter = (weights, version)
        self._call(lambda actor: actor.load_adapter.remote(weights, version))

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, rng_state: Any | None
    ) -> tuple[list[list[Completion]], Any]:
        return self._call(lambda actor: actor.generate.remote(prompts, params, rng_state))

    def score(self, probe) -> list[list[float]]:
        return self._call(lambda actor: actor.score.remote(probe))

    @property
    def probe_engine(self) -> tuple[str, str]:
        return tuple(self._call(lambda actor: actor.probe_engine.remote()))

    def _call(self, submit: Callable[[Any], Any]) -> Any:
        import ray
        from ray.exceptions import RayActorError

        while True:
            try:
                return ray.get(submit(self.actor))
            except RayActorError as exc:
                if self.restarts >= self.max_restarts:
                    raise OpenRFTError(
                        f"generation replica {self.name} died {self.restarts + 1} times; last: {exc}"
                    ) from None
                self.restarts += 1
                self.on_event(
                    "warn",
                    f"generation replica {self.name} died; replacing it and re-issuing its work "
                    f"(restart {self.restarts})",
                )
                self.actor = self.start()
                if self._adapter is not None:
                    ray.get(self.actor.load_adapter.remote(*self._adapter))

    def close(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


class RayRuntime:
    name = "ray"
    loads_model_locally = False

    def __init__(
        self,
        spec: JobSpec,
        on_event: Callable[[str, str], None] | None = None,
        address: str | None = None,
        address_field: str = "rollout.ray_address",
        reserved: str | None = None,
    ):
        """``address``: the cluster to join (``auto``, ``HOST:PORT``, ``ray://HOST:10001``), else
        ``rollout.ray_address``; neither: start Ray on this machine for the job. ``address_field`` names where
        the address came from, for the error when it cannot be reached. ``reserved``: the name of a placement
        group already reserved for the job (the service's admission, namespace ``openrft``), used instead of
        reserving one."""
        self.spec, self.on_event = spec, on_event or (lambda level, message: None)
        self.address, self.address_field = address or spec.rollout.ray_address, address_field
        self.reserved = reserved
        self.replicas: list[RayReplica] = []
        self._started_ray = False
        self._group = None
        self._learners: list = []

    def _connect(self):
        import ray

        if not ray.is_initialized():
            address = self.address
            problem = unreachable(address)
            if problem:
                raise OpenRFTError(f"{self.address_field} {address!r}: cannot connect to a Ray cluster: {problem}")
            try:
                namespace = RAY_NAMESPACE if self.reserved else None
                worker_env = ray_worker_env()  # a tenant's job: the operator's secrets blank on every node
                init_ray(
                    address,
                    namespace=namespace,
                    include_dashboard=False,
                    log_to_driver=True,
                    logging_level="WARNING",
                    runtime_env={"env_vars": worker_env} if worker_env else None,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise OpenRFTError(
                    f"{self.address_field} {address!r}: cannot connect to a Ray cluster: {exc}"
                ) from None
            self._started_ray = address is None
        return ray

    def _placement(self):
        """One bundle per learner and per generation actor; GPUs when the cluster has one per bundle."""
        ray = self._connect()
        from ray.util.placement_group import placement_group

        learners = self.spec.rollout.replicas
        if self.reserved:  # the service's admission reserved it before the job was claimed
            group = ray.util.get_placement_group(self.reserved)
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
            self._group, self._bundle = group, dict(group.bundle_specs[0])
            return ray
        group_bundles = bundles(self.spec, ray.cluster_resources().get("GPU", 0))
        count, bundle = len(group_bundles), group_bundles[0]
        group = placement_group(group_bundles, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            ray.util.remove_placement_group(group)
            raise OpenRFTError(
                f"the Ray cluster cannot place the job: it needs {count} x {bundle} (rollout.replicas {learners} "
                f"learners + {count - learners} generation actors of rollout.generation_replicas); the cluster has "
                f"{ray.cluster_resources()}"
            )
        self._group, self._bundle = group, bundle
        return ray

    def _options(self, index: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(placement_group=self._group, placement_group_bundle_index=index)
        return {
            "num_cpus": self._bundle["CPU"],
            "num_gpus": self._bundle.get("GPU", 0),
            "scheduling_strategy": strategy,
            "max_concurrency": 1,
        }

    def build_learner(self, spec: JobSpec, parts: JobParts) -> LearnerParts:
        ray = self._placement()
        if spec.rollout.learner_sharding == "fsdp":  # one learner sharded over the actors
            from openrft.runtime.ray_sharded import build_sharded_learner

            learner_parts, self._learners = build_sharded_learner(self, spec)
            return learner_parts
        spec_json = spec.model_dump_json()
        self._learners = [
            ray.remote(LearnerActor).options(**self._options(i)).remote(spec_json, i)
            for i in range(spec.rollout.replicas)
        ]
        actor = self._learners[0]
        return LearnerParts(
            GroupLearner(self._learners),
            AdapterFilesWriter(lambda: ray.get(actor.adapter_files.remote())),
            GroupGenerator(self._learners),
            lambda: actor.adapter_state.remote(),
            lambda probe: ray.get(actor.probe_scores.remote(probe)),
        )

    def generation_replicas(
        self, spec: JobSpec, parts: JobParts, learner: LearnerParts, run_dir: Path
    ) -> list[GenerationReplica]:
        import ray

        if spec.rollout.generator_base_url:
            return [_FetchingReplica(r) for r in remote_replicas(spec, parts, run_dir)]
        remote_class = ray.remote(GenerationActor)
        spec_json = spec.model_dump_json()

        def starter(index: int) -> Callable[[], Any]:
            seed = replica_seed(spec.training.seed, index)
            return lambda: remote_class.options(**self._options(spec.rollout.replicas + index)).remote(spec_json, seed)

        self.replicas = [
            RayReplica(starter(i), f"ray-{i}", self.on_event) for i in range(spec.rollout.generation_replicas)
        ]
        return list(self.replicas)

    def close(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        for replica in self.replicas:
            with contextlib.suppress(Exception):  # already closed or dead
                replica.close()
        for learner in self._learners:
            ray.kill(learner, no_restart=True)
        if self._group is not None:
            with contextlib.suppress(Exception):  # already removed (the service frees a cancelled job's group)
                ray.util.remove_placement_group(self._group)
        if self._started_ray:
            ray.shutdown()


class _FetchingReplica:
    """A remote-server replica under the Ray runtime: adapter weights arrive as object refs."""

    def __init__(self, replica: GenerationReplica):
        self.replica, self.name = replica, replica.name

    def load_adapter(self, weights: Any, version: int) -> None:
        import ray

        self.replica.load_adapter(ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights, version)

    def generate(self, prompts, params, rng_state):
        return self.replica.generate(prompts, params, rng_state)

    def score(self, probe):
        return self.replica.score(probe)

    @property
    def probe_engine(self) -> tuple[str, str]:
        return self.replica.probe_engine

    def close(self) -> None:
        self.replica.close()
