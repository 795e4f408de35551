"""Admission on the server's Ray cluster (``--ray-address``): a job starts only once its placement group is reserved.

- At submission (``refuse_if_never_fits``): a job whose bundles could not be placed even on the whole, idle
  cluster is refused with a 400 naming the field and the resource (``job_too_large``).
- The next queued job: the oldest of the tenant holding the least of the cluster now (``dominant_shares``: the
  largest fraction of the cluster's CPUs or GPUs its running jobs hold), ties in the service's round-robin order,
  so one tenant's many jobs do not keep another's waiting.
- In the worker (``ClusterAdmission.reserve``): before the next queued job is claimed, its placement group
  (``openrft.runtime.placement.bundles``, the same ``RayRuntime`` would ask for) is created and must be ready
  within a moment; otherwise it is removed again and the job stays ``queued`` with the reason
  (``2 CPU, 1 free``), and the jobs behind it wait their turn (no job is overtaken, so none starves).
- The reserved group is named ``openrft-JOB-aATTEMPT`` in the ``openrft`` namespace and handed to the job process
  (``--placement-group``), whose ``RayRuntime`` places its actors in it; the worker removes it when the job
  process ends. It is owned by the worker's connection, so a worker that dies frees it.

The worker's process and the API server connect to the cluster as a Ray driver (lazily, once per process).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from dataclasses import dataclass

from openrft.runtime.cluster_address import init_ray, unreachable
from openrft.runtime.placement import RAY_NAMESPACE, bundles, generation_actors, placed_runtime
from openrft.service.errors import ApiError
from openrft.spec.job import JobSpec

log = logging.getLogger("openrft.admission")
READY_WAIT_S = 2.0

_connect_lock = threading.Lock()


def connect(address: str):
    """This process's connection to the operator's cluster (one per process), in the ``openrft`` namespace."""
    import ray

    with _connect_lock:
        if not ray.is_initialized():
            problem = unreachable(address)
            if problem:
                raise ConnectionError(f"the server's --ray-address {address!r}: {problem}")
            init_ray(
                address,
                namespace=RAY_NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
    return ray


def group_name(job_id: str, attempt: int) -> str:
    return f"openrft-{job_id}-a{attempt}"


def _amount(value: float) -> str:
    return f"{value:g}"


def _total(group: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in group:
        for name, value in bundle.items():
            total[name] = total.get(name, 0.0) + value
    return total


def _shape(spec: JobSpec) -> str:
    actors = generation_actors(spec)
    return (
        f"rollout.replicas {spec.rollout.replicas} learner(s) + {actors} generation actor(s), "
        f"runtime.threads {spec.runtime.threads or 1} CPU each"
    )


@dataclass
class Decision:
    """A reservation (``group`` set: a placement group; ``devices``: this machine's GPUs, ``devices.py``) or the
    reason the job waits (``reason``)."""

    group: str | None = None
    reason: str | None = None
    devices: str | None = None  # CUDA_VISIBLE_DEVICES of the job's process ("": no GPU); None: left as it is
    reserved: dict[str, float] | None = None  # the placement group's resources in all (a tenant's quota counts them)


class ClusterAdmission:
    def __init__(self, address: str):
        self.address = address
        self.reserved: dict[str, object] = {}  # job id -> its placement group

    def _ray(self):
        return connect(self.address)

    def nodes(self) -> list[dict[str, float]]:
        """The total resources of each alive node."""
        return [n["Resources"] for n in self._ray().nodes() if n.get("Alive")]

    def never_fits(self, spec: JobSpec) -> str | None:
        """Why ``spec``'s placement group cannot be placed even on the whole idle cluster, else None."""
        nodes = self.nodes()
        group = bundles(spec, sum(n.get("GPU", 0.0) for n in nodes))
        if not group:
            return None
        bundle = group[0]  # all of a job's bundles are alike
        places = 0
        for node in nodes:
            places += min(math.floor(node.get(name, 0.0) / need + 1e-9) for name, need in bundle.items() if need > 0)
        if places >= len(group):
            return None
        totals = {name: sum(n.get(name, 0.0) for n in nodes) for name in bundle}
        limiting = min(bundle, key=lambda name: sum(math.floor(n.get(name, 0.0) / bundle[name]) for n in nodes))
        per_node = ", ".join(_amount(n.get(limiting, 0.0)) for n in nodes)
        return (
            f"the job asks for {len(group)} bundles of {_amount(bundle[limiting])} {limiting} ({_shape(spec)}) but the "
            f"Ray cluster can place at most {places}: its nodes have {per_node} {limiting} "
            f"({_amount(totals[limiting])} {limiting} in all)"
        )

    def reserve(self, job_id: str, attempt: int, spec: JobSpec) -> Decision:
        """Reserve ``spec``'s placement group for this attempt, or say what it waits for."""
        if placed_runtime(spec, self.address) != "ray":  # stays in its job process (rollout.engine vllm)
            return Decision()
        ray = self._ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        group = bundles(spec, ray.cluster_resources().get("GPU", 0.0))
        need, free = _total(group), ray.available_resources()
        short = [name for name, value in need.items() if value > free.get(name, 0.0) + 1e-9]
        if short:
            return Decision(reason=self.waiting(need, free, short))
        name = group_name(job_id, attempt)
        reserved = placement_group(group, strategy="PACK", name=name)
        ready, _ = ray.wait([reserved.ready()], timeout=READY_WAIT_S)
        if not ready:  # free in total, not in bundles that fit: wait for the cluster to change
            remove_placement_group(reserved)
            shape = " + ".join(f"{_amount(value)} {name}" for name, value in group[0].items())
            return Decision(reason=f"waiting for room on the Ray cluster for {len(group)} bundles of {shape} each")
        self.reserved[job_id] = reserved
        return Decision(group=name, reserved=_total(group))

    def totals(self) -> dict[str, float]:
        """The cluster's resources in all (CPU, GPU, ...)."""
        return dict(self._ray().cluster_resources())

    @staticmethod
    def waiting(need: dict[str, float], free: dict[str, float], short: list[str]) -> str:
        parts = [f"{_amount(need[name])} {name}, {_amount(free.get(name, 0.0))} free" for name in short]
        return "waiting for resources on the Ray cluster: " + "; ".join(parts)

    def release(self, job_id: str) -> None:
        reserved = self.reserved.pop(job_id, None)
        if reserved is None:
            return
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):  # the job's runtime may have removed it already
            remove_placement_group(reserved)


def dominant_shares(active: list[tuple[str, dict]], totals: dict[str, float]) -> dict[str, float]:
    """Each tenant's dominant share of the cluster (dominant resource fairness): the largest fraction of any of its
    CPUs or GPUs that its running jobs' placement groups hold. ``active``: (owner, stored spec) of running jobs."""
    held: dict[str, dict[str, float]] = {}
    for owner, stored in active:
        try:
            spec = JobSpec.model_validate(stored)
        except ValueError:
            continue
        if placed_runtime(spec, "cluster") != "ray":
            continue
        for name, value in _total(bundles(spec, totals.get("GPU", 0.0))).items():
            held.setdefault(owner, {})[name] = held.get(owner, {}).get(name, 0.0) + value
    return {
        owner: max((value / totals[name] for name, value in use.items() if totals.get(name)), default=0.0)
        for owner, use in held.items()
    }


_admissions: dict[str, ClusterAdmission] = {}


def for_address(address: str) -> ClusterAdmission:
    """The admission of this process for ``address`` (the worker and the API server of one process share it)."""
    with _connect_lock:
        return _admissions.setdefault(address, ClusterAdmission(address))


def refuse_if_never_fits(address: str | None, spec: JobSpec, field: str = "rollout.replicas") -> None:
    """400 ``job_too_large`` naming ``field`` and the resource, for a job larger than the whole cluster."""
    if not address:
        return
    if placed_runtime(spec, address) != "ray":
        return
    try:
        why = for_address(address).never_fits(spec)
    except Exception as exc:  # the cluster is down: the job queues, and the worker says why it waits
        log.warning("could not check the job against the Ray cluster at %s: %s", address, exc)
        return
    if why is not None:
        raise ApiError(400, f"{field}: {why}", "job_too_large", field)
