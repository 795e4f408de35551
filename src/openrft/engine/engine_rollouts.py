"""Synchronous rollouts from a generation engine that holds its own copy of the policy: vLLM (a server
by URL, or colocated in this process) or ``openrft serve-model``.

The learner's in-process sampler shares the learner's model, so the synchronous source needs nothing
sent; an engine does: before each step's generation, the learner's current weights (a LoRA adapter, or
the full weights) go to every replica that lacks that policy version. The step's prompts are split
across the replicas (``ceil(prompts / replicas)`` each, in order) and generated in parallel.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from openrft.data.records import Example
from openrft.data.sampler import EpochSampler
from openrft.engine.async_rollouts import GenerationReplica
from openrft.engine.rollouts import RolloutGroup, SyncRolloutSource, score_groups
from openrft.engine.sync_check import SyncChecker
from openrft.rewards.runner import RewardRunner
from openrft.rollout.remote import GenerationServerError
from openrft.rollout.types import Completion, SamplingParams


class EngineRolloutSource(SyncRolloutSource):
    """Every rollout has policy age 0: the replicas are brought to the learner's version before sampling."""

    def __init__(
        self,
        replicas: list[GenerationReplica],
        rewards: RewardRunner,
        sampler: EpochSampler,
        examples: list[Example],
        prompt_ids: list[list[int]],
        params: SamplingParams,
        *,
        adapter_state: Callable[[], Any],
        version: Callable[[], int],
        checker: SyncChecker | None = None,
    ):
        if not replicas:
            raise ValueError("engine rollouts need at least one generation replica")
        super().__init__(None, rewards, sampler, examples, prompt_ids, params)  # type: ignore[arg-type]
        self.replicas, self.adapter_state, self.version = replicas, adapter_state, version
        self.checker = checker  # the sync probe after each load (engine/sync_check.py)
        self._loaded: list[int | None] = [None] * len(replicas)  # the version each replica serves
        self._pool = ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix="engine-rollouts")

    def next_batch(self, step: int) -> list[RolloutGroup]:
        indices = self.sampler.next_batch()
        examples = [self.examples[i] for i in indices]
        prompts = [self.prompt_ids[i] for i in indices]
        try:
            self._publish()
            start = time.perf_counter()
            groups = self._generate(prompts)
            self.generate_seconds = time.perf_counter() - start
        except GenerationServerError as exc:  # the step that failed, with the server's own message (its URL)
            raise GenerationServerError(f"step {step}: {exc}", exc.status) from None
        outcomes = score_groups(self.rewards, examples, groups, step)
        return [RolloutGroup(e, p, g, o) for e, p, g, o in zip(examples, prompts, groups, outcomes)]

    def _publish(self) -> None:
        """The learner's current weights to every replica that serves another version."""
        version = self.version()
        stale = [i for i, loaded in enumerate(self._loaded) if loaded != version]
        if not stale:
            return
        weights = self.adapter_state()
        if self.checker is None:
            self._load(stale, weights, version)
            return
        # the replicas load and score in a worker while the learner scores here (its weights stay still until the
        # step that follows); each check waits for the learner's scores
        loading = self._pool.submit(self._load, stale, weights, version)
        try:
            self.checker.published(version)
        except BaseException:
            wait([loading])  # its checks fail on the missing scores: the learner's error is the one raised
            raise
        loading.result()

    def _load(self, stale: list[int], weights: Any, version: int) -> None:
        """``weights`` to the ``stale`` replicas in turn, each probed after its load."""
        for index in stale:
            self._loaded[index] = None  # a failed load leaves the replica's version unknown
            self.replicas[index].load_adapter(weights, version)
            if self.checker is not None:
                self.checker.check(index, self.replicas[index], weights, version)
            self._loaded[index] = version

    def _generate(self, prompts: list[list[int]]) -> list[list[Completion]]:
        size = math.ceil(len(prompts) / len(self.replicas))
        chunks = [(r, prompts[i * size : (i + 1) * size]) for i, r in enumerate(self.replicas)]
        futures = [self._pool.submit(r.generate, chunk, self.params, None) for r, chunk in chunks if chunk]
        return [group for future in futures for group in future.result()[0]]

    def step_metrics(self) -> dict[str, float]:
        return self.checker.metrics() if self.checker is not None else {}

    def policy_updated(self, version: int) -> None:
        """Nothing now: the weights are sent before the next generation (``_publish``), also after a resume."""

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for replica in self.replicas:
            replica.close()
