"""Where a job's pieces run: this process (``local``) or Ray actors (``ray``)."""

from __future__ import annotations

from collections.abc import Callable

from openrft.engine.local_runtime import LocalRuntime, Runtime
from openrft.errors import OpenRFTError
from openrft.spec.job import JobSpec


def runtime_for(spec: JobSpec, on_event: Callable[[str, str], None] | None = None) -> Runtime:
    """The runtime ``spec.rollout.runtime`` names; Ray is imported only when asked for."""
    from openrft.runtime.torchrun import torchrun_world

    if torchrun_world() > 1 and (spec.rollout.runtime != "local" or spec.rollout.learner_sharding != "fsdp"):
        raise OpenRFTError(
            f"started by torchrun as {torchrun_world()} processes: that runs one sharded learner, which needs "
            f"rollout.runtime local and rollout.learner_sharding fsdp (they are {spec.rollout.runtime!r} and "
            f"{spec.rollout.learner_sharding!r})"
        )
    if spec.rollout.runtime == "local":
        if spec.rollout.learner_sharding == "fsdp":
            if torchrun_world() > 1:
                from openrft.runtime.torchrun import TorchrunRuntime

                return TorchrunRuntime(spec)
            raise OpenRFTError(
                "rollout.learner_sharding is 'fsdp' but rollout.runtime is 'local' outside torchrun: a sharded "
                "learner runs as rollout.replicas Ray actors (rollout.runtime ray) or as the processes of "
                "torchrun --nproc-per-node N $(which openrft) train ... (docs/scaling.md)"
            )
        return LocalRuntime()
    try:
        import ray  # noqa: F401
    except ImportError:
        raise OpenRFTError("rollout.runtime is 'ray' but Ray is not installed: pip install 'openrft[ray]'") from None
    from openrft.runtime.ray_runtime import RayRuntime

    return RayRuntime(spec, on_event)


__all__ = ["LocalRuntime", "Runtime", "runtime_for"]
