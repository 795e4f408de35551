"""The composition root: where a job's learner and generators run, for every caller.

``runtime_for(spec, on_event, cluster=...)`` is the one place that turns a job's spec (and, in the service,
the operator's cluster) into a runtime: this process (``LocalRuntime``), with learner processes of this machine
beside it (``LocalParallelRuntime``, where the job may use them: ``placement.local_processes_wanted``), Ray actors
(``RayRuntime``) or the ranks of torchrun (``TorchrunRuntime``). The CLI (``openrft train``), the service's job
process, the benchmarks and the tests all ask it; no other module compares runtime names to choose one. A new backend is
one module here plus one branch below (docs/design.md, "Extending").

What a job asks for before it runs (placement-group bundles, CPUs, GPUs) is ``placement.job_resources``,
which imports neither Ray nor torch, so the API can show it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from openrft.errors import OpenRFTError
from openrft.runtime.placement import JobResources, job_resources, local_processes_wanted, placed_runtime
from openrft.spec.job import JobSpec

if TYPE_CHECKING:
    from openrft.engine.local_runtime import Runtime


def runtime_for(
    spec: JobSpec,
    on_event: Callable[[str, str], None] | None = None,
    *,
    cluster: str | None = None,
    placement_group: str | None = None,
) -> Runtime:
    """The runtime of ``spec``; Ray and torch are imported only when asked for.

    ``cluster`` is an operator's Ray cluster (``openrft serve --ray-address``, never a tenant's): the job
    runs there, whatever runtime it named (``placement.placed_runtime``). Its ``rollout.runtime`` is then set
    to ``ray`` on ``spec`` itself, so the run directory's ``spec.json`` records where it ran and the engine
    sees the runtime it was given. The cluster's address replaces ``rollout.ray_address``. ``placement_group``
    names the group the service's admission already reserved for the job there (``openrft`` namespace)."""
    from openrft.runtime.torchrun import torchrun_world

    runtime = placed_runtime(spec, cluster)
    if torchrun_world() > 1 and (runtime != "local" or spec.rollout.learner_sharding != "fsdp"):
        raise OpenRFTError(
            f"started by torchrun as {torchrun_world()} processes: that runs one sharded learner, which needs "
            f"rollout.runtime local and rollout.learner_sharding fsdp (they are {runtime!r} and "
            f"{spec.rollout.learner_sharding!r})"
        )
    if runtime == "local":
        from openrft.engine.local_runtime import LocalRuntime

        if spec.rollout.learner_sharding == "fsdp":
            if torchrun_world() > 1:
                from openrft.runtime.torchrun import TorchrunRuntime

                return TorchrunRuntime(spec)
            raise OpenRFTError(
                "rollout.learner_sharding is 'fsdp' but rollout.runtime is 'local' outside torchrun: a sharded "
                "learner runs as rollout.replicas Ray actors (rollout.runtime ray) or as the processes of "
                "torchrun --nproc-per-node N $(which openrft) train ... (docs/scaling.md)"
            )
        if local_processes_wanted(spec):
            from openrft.runtime.local_parallel import LocalParallelRuntime

            return LocalParallelRuntime(on_event)
        return LocalRuntime()
    try:
        import ray  # noqa: F401
    except ImportError:
        why = f"the server runs jobs on the Ray cluster {cluster!r}" if cluster else "rollout.runtime is 'ray'"
        raise OpenRFTError(f"{why} but Ray is not installed: pip install 'openrft[ray]'") from None
    from openrft.runtime.ray_runtime import RayRuntime

    if spec.rollout.runtime != runtime:
        spec.rollout.runtime = runtime
    if cluster:
        return RayRuntime(
            spec, on_event, address=cluster, address_field="the server's --ray-address", reserved=placement_group
        )
    return RayRuntime(spec, on_event)


def runtime_factory(
    on_event: Callable[[str, str], None] | None = None,
    *,
    cluster: str | None = None,
    placement_group: str | None = None,
) -> Callable[[JobSpec], Runtime]:
    """``runtime_for`` with these arguments, for ``RFTJob.from_run_dir`` (a resumed run's spec is read there)."""
    return lambda spec: runtime_for(spec, on_event, cluster=cluster, placement_group=placement_group)


def __getattr__(name: str) -> Any:  # the engine (torch) is imported only when these are asked for
    if name in ("LocalRuntime", "Runtime"):
        from openrft.engine import local_runtime

        return getattr(local_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "JobResources",
    "LocalRuntime",
    "Runtime",
    "job_resources",
    "placed_runtime",
    "runtime_factory",
    "runtime_for",
]
