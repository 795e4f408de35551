"""Generation replicas: the workers that sample completions, in this process, as Ray actors or remote servers.

The engine's asynchronous source (``engine.async_rollouts``) drives them; tool episodes
(``tools.episodes``) wrap them.
"""

from __future__ import annotations

from typing import Any, Protocol

from openrft.rollout.sync_probe import ProbeSet
from openrft.rollout.types import Completion, Generator, SamplingParams


class GenerationReplica(Protocol):
    """One generation worker: in this process, a Ray actor, or a remote inference server."""

    name: str

    def load_adapter(self, weights: Any, version: int) -> None:
        """Serve ``weights`` (whatever the runtime publishes: a dict of tensors, an object ref) as ``version``."""
        ...

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, rng_state: Any | None
    ) -> tuple[list[list[Completion]], Any | None]:
        """Completions per prompt, sampled from the random stream ``rng_state`` (None: the replica's
        own stream); returns the stream's state after sampling."""
        ...

    def score(self, probe: ProbeSet) -> list[list[float]]:
        """The sync probe's continuation log-probs under the policy this replica serves (``engine/sync_check.py``)."""
        ...

    @property
    def probe_engine(self) -> tuple[str, str]:
        """(engine, dtype): which sync-probe tolerance applies (``rollout/sync_probe.py``)."""
        ...

    def close(self) -> None: ...


class GeneratorReplica:
    """A ``Generator`` as a replica. A generator with an ``rng`` (in-process) has its stream set and read
    around each call; one without (a remote server) samples with the server's own randomness."""

    def __init__(self, generator: Generator, name: str, seed: int | None = None):
        self.generator, self.name = generator, name
        self.scorer = generator  # kept: tool episodes wrap ``generator`` later, and score through this one
        rng = getattr(generator, "rng", None)
        if rng is not None and seed is not None:
            rng.manual_seed(seed)

    def load_adapter(self, weights: Any, version: int) -> None:
        self.generator.load_adapter(weights, version)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, rng_state: Any | None
    ) -> tuple[list[list[Completion]], Any | None]:
        rng = getattr(self.generator, "rng", None)
        if rng is not None and rng_state is not None:
            rng.set_state(rng_state)
        groups = self.generator.generate(prompts, params)
        return groups, rng.get_state() if rng is not None else rng_state

    def score(self, probe: ProbeSet) -> list[list[float]]:
        return self.scorer.score(probe)

    @property
    def probe_engine(self) -> tuple[str, str]:
        return self.scorer.probe_engine

    def close(self) -> None:
        close = getattr(self.generator, "close", None)
        if close is not None:
            close()
