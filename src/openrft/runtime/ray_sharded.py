"""The sharded learner on Ray (``rollout.runtime: ray``, ``rollout.learner_sharding: fsdp``).

``rollout.replicas`` actors, one per placement-group bundle, form one process group (rank 0's node
address, a free port it picks) and shard the policy with FSDP2. The driver sends every call to all of
them, in one order under a lock (most calls are collectives: a rank that ran them in another order
would wait forever). A step gives every rank the whole batch; each trains on its contiguous share.
A rank that dies fails the call on the driver at once, naming the rank; the other ranks,
waiting in a collective, are killed with the runtime, and the job resumes from its last checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any

from openrft.engine.local_runtime import AdapterFilesWriter, LearnerParts
from openrft.errors import OpenRFTError
from openrft.runtime.sharded import ShardedEvalGenerator, ShardedWorker, merge_states

DEATH_GRACE_S = 10.0
"""How long a failed call waits for the other ranks' results, to name a rank that died."""


class LearnerRankDied(OpenRFTError):
    """A rank of the sharded learner died: the step (or call) failed; resume from the last checkpoint."""


class RayShardedLearner:
    """The learner as the loop sees it, running as ``ShardedWorker`` actors."""

    def __init__(self, actors: list):
        import ray

        self._ray, self.actors, self._lock = ray, actors, threading.Lock()
        address, port = ray.get(actors[0].rendezvous.remote())
        versions = self.call("setup", *(len(actors), address, port), rank_args=True)
        self.version = versions[0]
        self.use_kl = self.call("use_kl")[0]

    def submit(self, method: str, *args: Any, rank_args: bool = False, shares: list | None = None) -> list:
        """Every actor's call, submitted in one order; ``shares``: a different first argument per actor."""
        with self._lock:
            refs = []
            for rank, actor in enumerate(self.actors):
                call = getattr(actor, method).remote
                if rank_args:
                    refs.append(call(rank, *args))
                elif shares is not None:
                    refs.append(call(shares[rank], *args))
                else:
                    refs.append(call(*args))
            return refs

    def call(self, method: str, *args: Any, rank_args: bool = False, shares: list | None = None) -> list:
        return self.wait(method, self.submit(method, *args, rank_args=rank_args, shares=shares))

    def wait(self, method: str, refs: list) -> list:
        """The results in rank order. A rank that died fails the call at once, by name, also when a
        surviving rank's collective failed first (its peer gone)."""
        ray = self._ray
        pending = dict(zip(refs, range(len(refs)), strict=True))
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(ready[0])
            try:
                ray.get(ready[0])
            except Exception:
                dead = self._dead_rank({ready[0]: rank, **pending})
                if dead is None:
                    raise
                dead, lost = dead
                raise LearnerRankDied(  # from the rank's loss: the service resumes the job (ray_faults.py)
                    f"learner rank {dead} of {len(self.actors)} (rollout.learner_sharding fsdp) died during "
                    f"{method}; the update was not applied: resume the job from its last checkpoint"
                ) from lost
        return ray.get(refs)

    def _dead_rank(self, refs: dict) -> tuple[int, BaseException] | None:
        from ray.exceptions import RayActorError

        done, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=DEATH_GRACE_S)
        for ref in done:
            try:
                self._ray.get(ref)
            except RayActorError as lost:
                return refs[ref], lost
            except Exception:  # a survivor's failed collective: look further
                continue
        return None

    def step(self, samples: list) -> dict[str, float]:
        """Every rank gets the whole batch (once, through the object store) and trains on its share."""
        metrics, self.version = self.call("step", self._ray.put(samples))[0]
        return metrics

    def state_dict(self) -> dict:
        return merge_states(self.call("state_dict"))

    def load_state_dict(self, state: dict) -> None:
        self.version = self.call("load_state_dict", self._ray.put(state))[0]

    def adapter_state(self):
        """Rank 0's gathered weights, as an object reference (the other ranks return nothing)."""
        refs = self.submit("adapter_state")
        return refs[0]

    def adapter_files(self) -> dict[str, bytes]:
        return self.call("adapter_files")[0]


def build_sharded_learner(runtime, spec) -> tuple[LearnerParts, list]:
    """The actors (in the runtime's placement group) and the learner parts the engine uses."""
    import ray

    spec_json = spec.model_dump_json()
    actors = [
        ray.remote(ShardedWorker).options(**runtime._options(i)).remote(spec_json) for i in range(spec.rollout.replicas)
    ]
    learner = RayShardedLearner(actors)
    parts = LearnerParts(
        learner, AdapterFilesWriter(learner.adapter_files), ShardedEvalGenerator(learner), learner.adapter_state
    )
    return parts, actors
