"""The Ray runtime (``rollout.runtime: ray``): the learner and the generation replicas are Ray actors.

- One placement group holds a bundle per learner (``rollout.replicas``) and one per generation
  actor (``rollout.generation_replicas``, where the job starts them: ``generation_actors``), one CPU each
  (``runtime.threads`` CPUs when set) and one GPU each when the cluster has enough; the job waits for it
  and fails with the missing resources named.
- Several learners are data-parallel (``RayLearner``): each takes a share of the batch, they sum their
  gradients among themselves (gloo, or NCCL on GPUs), and every learner applies the sum, so they stay
  identical; a step is one call to each learner.
- Synchronous rollouts from the local engine are sampled by the learners themselves, each a share of the
  prompts (``RayLearnerGenerator``): no weights move, and N learners use N processes for both phases.
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
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openrft.calls.credentials import ray_worker_env
from openrft.engine.async_rollouts import GenerationReplica
from openrft.engine.local_runtime import (
    AdapterFilesWriter,
    LearnerParts,
    learner_config,
    remote_replicas,
    replica_seed,
)
from openrft.engine.setup import JobParts
from openrft.errors import OpenRFTError
from openrft.learner.learner import SUM_KEYS, add_sums, mini_batches, response_tokens, step_metrics, trained
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.runtime.cluster_address import init_ray, unreachable
from openrft.runtime.placement import RAY_NAMESPACE, bundles
from openrft.runtime.process_group import all_reduce_gradients, free_port, join_process_group, node_address
from openrft.runtime.ray_faults import get_naming_the_lost
from openrft.spec.job import JobSpec

PLACEMENT_TIMEOUT_S = 120.0
MAX_REPLICA_RESTARTS = 5


def _load_model(spec: JobSpec):
    from openrft.models import configure_threads, eos_token_ids, load_causal_lm, load_tokenizer, pick_device, pick_dtype

    configure_threads(spec.runtime.threads or 1)
    device = pick_device(spec.runtime.device)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model.revision)
    torch.manual_seed(spec.training.seed)  # as the local runtime: the same adapter initialisation
    model = load_causal_lm(spec.model.name_or_path, device, pick_dtype(spec.model.dtype, device), spec.model.revision)
    return model, tokenizer, eos_token_ids(tokenizer, model)


class LearnerActor:
    """Policy, learner and a generator on one actor (``index`` picks its sampling stream)."""

    def __init__(self, spec_json: str, index: int = 0):
        from openrft.learner import Learner, Policy
        from openrft.rollout.local import TransformersGenerator

        spec = JobSpec.model_validate_json(spec_json)
        model, tokenizer, eos = _load_model(spec)
        self.policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
        # data-parallel learners on CPUs may share one machine's memory: each sizes its micro-batches for its part
        on_cpu = model.device.type == "cpu"
        sharers = spec.rollout.replicas if on_cpu else 1
        self.learner = Learner(self.policy, learner_config(spec, tokenizer.pad_token_id), memory_sharers=sharers)
        seed = replica_seed(spec.training.seed, index)  # learners sampling shares of a batch draw independently
        self.generator = TransformersGenerator(self.policy.model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)

    def version(self) -> int:
        return self.learner.version

    def use_kl(self) -> bool:
        return self.learner.use_kl

    def ppo_mini_batches(self) -> int:
        return self.learner.config.algorithm.ppo_mini_batches

    def pid(self) -> int:
        return os.getpid()

    def step(self, samples: list) -> tuple[dict[str, float], int]:
        metrics = self.learner.step(samples)
        self.generator.set_policy_version(self.learner.version)
        return metrics, self.learner.version

    def rendezvous(self) -> tuple[str, int]:
        """Where the first learner listens for the data-parallel process group: its node's address, a free port."""
        return node_address(), free_port()

    def join(self, rank: int, world_size: int, address: str, port: int) -> None:
        join_process_group(rank, world_size, address, port, self.learner.device)

    def train(self, shares: list[list], tokens: list[int]) -> tuple[dict[str, float], list[float], list, float, int]:
        """Data-parallel: a step on this learner's share of each mini-batch (``tokens``: each mini-batch's trained
        tokens over all learners). Before each update the learners sum their gradients among themselves
        (``all_reduce_gradients``), so every one applies the same update and they stay equal. Returns the loss sums
        of its shares, the updates' gradient norms, the old log-probs it recorded for the later mini-batches' samples
        (None for a stale one), the learning rate and the version."""
        later = [s for share in shares[1:] for s in share]
        self.learner.record_old_logp(later)  # the policy before the first update, for this learner's shares
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        norms = []
        for share, total in zip(shares, tokens, strict=True):
            if share:
                add_sums(sums, self.learner.accumulate(share, total))
            all_reduce_gradients(self.policy.trainable_parameters())
            norms.append(self.learner.apply_update())
        lr, version = self.end_step()
        return sums, norms, [s.old_logp for s in later], lr, version

    def old_logp(self, samples: list) -> list[list[float]]:
        """The current policy's log-probs of ``samples``, as recorded before a step's first update."""
        self.learner.record_old_logp(samples)
        return [s.old_logp for s in samples]

    def end_step(self) -> tuple[float, int]:
        self.learner.end_step()
        self.generator.set_policy_version(self.learner.version)
        return self.learner.optimizer.param_groups[0]["lr"], self.learner.version

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> int:
        self.learner.load_state_dict(state)
        self.generator.set_policy_version(self.learner.version)
        return self.learner.version

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.policy.adapter_state()

    def probe_scores(self, probe) -> list[list[float]]:
        """The sync probe's continuation log-probs under the current policy (``rollout/sync_probe.py``)."""
        from openrft.rollout.sync_probe import score_with_model

        return score_with_model(self.policy.model, probe)

    def adapter_files(self) -> dict[str, bytes]:
        from openrft.engine.checkpoints import save_adapter

        with tempfile.TemporaryDirectory() as tmp:
            save_adapter(self.policy.model, Path(tmp))
            return {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None) -> list[list[Completion]]:
        return self.generator.generate(prompts, params, seed=seed)


class GenerationActor:
    """A generation replica: its own copy of the base model, the policy's adapter loaded by version."""

    def __init__(self, spec_json: str, seed: int):
        from peft import get_peft_model

        from openrft.learner.lora_fused import fuse_lora_linears
        from openrft.learner.policy import POLICY_ADAPTER, lora_config
        from openrft.rollout.local import TransformersGenerator

        spec = JobSpec.model_validate_json(spec_json)
        model, tokenizer, eos = _load_model(spec)
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


# the driver's side ------------------------------------------------------------------------------


def contiguous_shares(items: list, count: int) -> list[list]:
    """``items`` cut into ``count`` contiguous shares, one per learner, in order (the last ones may be empty)."""
    size = math.ceil(len(items) / count)
    return [items[i * size : (i + 1) * size] for i in range(count)]


class RayLearner:
    """The learner as the loop sees it (``step``, ``version``, state), running on ``LearnerActor``s.

    With several actors (``rollout.replicas``) the learners are data-parallel: each computes the
    gradient of its share of the batch (normalised by the global batch's tokens), the driver sums
    them, and every learner applies the same sum, so all of them hold the same weights; the first
    one serves evaluation, checkpoints and the adapter for the generators.
    """

    def __init__(self, actors: list):
        import ray

        self.actors, self._ray = actors, ray
        self.actor = actors[0]
        self.version, self.use_kl, self.algorithm_mini_batches = ray.get(
            [self.actor.version.remote(), self.actor.use_kl.remote(), self.actor.ppo_mini_batches.remote()]
        )
        if len(actors) > 1:  # data-parallel: the learners sum their gradients in a process group of their own
            address, port = ray.get(self.actor.rendezvous.remote())
            ray.get([a.join.remote(rank, len(actors), address, port) for rank, a in enumerate(actors)])

    def step(self, samples: list) -> dict[str, float]:
        if len(self.actors) == 1:
            metrics, self.version = self._ray.get(self.actor.step.remote(samples))
            return metrics
        total_tokens = response_tokens(samples)
        minis = [m for m in mini_batches(samples, self.algorithm_mini_batches) if trained(m)]
        tokens = [response_tokens(mini) for mini in minis]
        by_learner = [list(shares) for shares in zip(*(self._shares(mini) for mini in minis), strict=True)]
        refs = [a.train.remote(shares, tokens) for a, shares in zip(self.actors, by_learner)]
        results = get_naming_the_lost(self._ray, refs)  # a lost peer, not the survivors' broken collective
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        for shares, (learner_sums, _, old_logps, _, _) in zip(by_learner, results, strict=True):
            add_sums(sums, learner_sums)
            later = [s for share in shares[1:] for s in share]
            for sample, logp in zip(later, old_logps, strict=True):
                if sample.behaviour_logp is None:  # the anchor the ratio of a later mini-batch was taken against
                    sample.old_logp = logp
        _, norms, _, lr, self.version = results[0]
        return step_metrics(sums, total_tokens, sum(norms) / len(norms), lr, self.use_kl, len(minis))

    def _shares(self, samples: list) -> list[list]:
        return contiguous_shares(samples, len(self.actors))

    def state_dict(self) -> dict:
        return self._ray.get(self.actor.state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        ref = self._ray.put(state)
        self.version = self._ray.get([a.load_state_dict.remote(ref) for a in self.actors])[0]


class RayLearnerGenerator(PolicyVersioned):
    """Sampling on the learner actors, which hold the current policy (no weights to send).

    Training rollouts (no ``seed``) are cut into one contiguous share of prompts per learner, sampled at
    the same time, each learner from its own random stream: with several data-parallel learners on a
    small model that is what uses every core. Evaluation (always with a seed) runs on the first learner,
    so its figures do not depend on how many learners there are. ``rng`` only keeps the checkpoint format.
    """

    def __init__(self, actors: list):
        self.actors = actors
        self.rng = torch.Generator()

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        import ray

        if seed is not None or len(self.actors) == 1:
            return ray.get(self.actors[0].generate.remote(prompts, params, seed))
        shares = [(a, share) for a, share in zip(self.actors, contiguous_shares(prompts, len(self.actors))) if share]
        parts = ray.get([actor.generate.remote(share, params, None) for actor, share in shares])
        return [group for part in parts for group in part]


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
            RayLearner(self._learners),
            AdapterFilesWriter(lambda: ray.get(actor.adapter_files.remote())),
            RayLearnerGenerator(self._learners),
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
