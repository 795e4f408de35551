"""Where a job runs and what it asks for, read from its spec alone (no Ray, no torch: the API shows it).

- ``placed_runtime``: the runtime a job gets. Its own ``rollout.runtime``, except that a job given an
  operator's cluster (``openrft serve --ray-address``) runs on it: a local-runtime job's learners (and
  generation replicas, where it starts them) become Ray actors there, as with ``runtime: ray``. The one
  exception is ``rollout.engine: vllm``, whose vLLM engine lives in the learner's own process.
- ``bundles``: one placement-group bundle per learner and per generation actor, ``runtime.threads`` CPUs
  each (1 when unset) and one GPU each when the job asks for GPUs (``runtime.device`` cuda) or may use them
  (``auto``) and the cluster has one per bundle. ``RayRuntime`` reserves exactly these.
- ``job_resources``: the same, summed, for the job's API object and the dashboard before it starts.
- ``local_processes_wanted``: whether a local job may use learner processes of its machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from openrft.spec.job import JobSpec

RuntimeName = Literal["local", "ray"]
RAY_NAMESPACE = "openrft"  # where the service's admission names the placement groups it reserves for jobs


def placed_runtime(spec: JobSpec, cluster: str | None = None) -> RuntimeName:
    """``spec``'s runtime, or ``ray`` when the operator gave a cluster (``cluster``) and the job can use it."""
    if cluster and spec.rollout.generation_engine != "vllm":
        return "ray"
    return spec.rollout.runtime


def local_processes_wanted(spec: JobSpec) -> bool:
    """Whether a local job may run on learner processes of its machine (``local_parallel.py``):
    ``runtime.processes`` above 1, or unset with ``runtime.threads`` unset too, for a synchronous job of the local
    engine, not on a GPU, without a sharded learner (its learners live in the job's process). With tools or an
    agent, where the episodes are sampled is ``phase_threads.episodes_sampled_here``'s."""
    if spec.runtime.processes is not None:
        return spec.runtime.processes > 1
    return (
        spec.runtime.threads is None
        and spec.rollout.strategy == "sync"
        and spec.rollout.generation_engine == "local"
        and not spec.rollout.generator_base_url
        and spec.rollout.learner_sharding == "none"
        and not spec.runtime.device.startswith("cuda")
    )


def generation_actors(spec: JobSpec) -> int:
    """The generation actors a Ray job starts: none where the learners sample (synchronous rollouts from the
    local engine, ``learner_group.GroupGenerator``) or where servers do (``rollout.generator_base_url``)."""
    learners_sample = spec.rollout.strategy == "sync" and spec.rollout.generation_engine == "local"
    return 0 if learners_sample or spec.rollout.generator_base_url else spec.rollout.generation_replicas


def gpu_per_bundle(spec: JobSpec, count: int, cluster_gpus: float | None) -> float | None:
    """1 when the job's bundles take a GPU each, 0 when not, None when it depends on a cluster not yet seen.

    ``runtime.device`` cpu: never; cuda (or cuda:N): always (the job waits for them); auto: when the cluster
    has one per bundle (``cluster_gpus``; None: unknown)."""
    device = spec.runtime.device
    if device == "cpu":
        return 0.0
    if device.startswith("cuda"):
        return 1.0
    if cluster_gpus is None:
        return None
    return 1.0 if cluster_gpus >= count else 0.0


def bundles(spec: JobSpec, cluster_gpus: float | None) -> list[dict[str, float]]:
    """The placement group of a Ray job: learners first, then generation actors (Ray's resource names)."""
    count = spec.rollout.replicas + generation_actors(spec)
    gpus = gpu_per_bundle(spec, count, cluster_gpus) or 0.0
    bundle = {"CPU": float(spec.runtime.threads or 1), **({"GPU": gpus} if gpus else {})}
    return [dict(bundle) for _ in range(count)]


@dataclass(frozen=True)
class JobResources:
    """What a job will ask for, computed from its spec before it starts (the API's ``resources`` object)."""

    runtime: RuntimeName  # where its learners run: "ray" (actors) or "local" (the job's own process)
    learners: int  # learner processes: Ray actors, or 1 in the job's process
    generation_replicas: int  # generation actors on Ray (threads or server clients of a local job are not counted)
    cpu: float | None  # CPUs reserved (Ray: the bundles' sum); None: a local job takes the worker's cores
    gpu: float | None  # GPUs reserved; None: decided at start (runtime.device auto: when the cluster has them)
    ray_address_set: bool  # the job runs on the operator's cluster (openrft serve --ray-address)
    bundles: list[dict[str, float]] = field(default_factory=list)  # the placement group, one bundle per actor

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_resources(spec: JobSpec, cluster: str | None = None, cluster_gpus: float | None = None) -> JobResources:
    """The resources ``spec`` will ask for where it is placed (``cluster``: the operator's Ray address)."""
    runtime = placed_runtime(spec, cluster)
    if runtime == "local":
        threads = float(spec.runtime.threads) if spec.runtime.threads else None
        gpu = gpu_per_bundle(spec, 1, None)
        return JobResources("local", 1, 0, threads, gpu, bool(cluster))
    group = bundles(spec, cluster_gpus)
    count = len(group)
    per_gpu = gpu_per_bundle(spec, count, cluster_gpus)
    return JobResources(
        "ray",
        spec.rollout.replicas,
        generation_actors(spec),
        sum(b["CPU"] for b in group),
        None if per_gpu is None else per_gpu * count,
        bool(cluster),
        group,
    )
