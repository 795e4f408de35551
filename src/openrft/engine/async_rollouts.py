"""Asynchronous rollouts: generation replicas run ahead of the learner, bounded by the age tolerance.

One worker thread per generation replica loops: admit a chunk of prompts (``StalenessManager``),
load the newest published adapter if the replica lacks it, generate, and hand the completions to
the reward runner without waiting; scored groups land in a ready heap ordered by the sequence
number of their prompt. The learner takes the oldest ready groups, drops those older than the
tolerance (their prompts go back to the front of the queue) and trains on the rest; after each
update the new adapter is published and the admission window moves on.

Determinism: prompts come from the job's epoch sampler ``batch_size`` at a time, in order, and each
replica owns a random stream (replica ``r`` seeded ``seed + r * REPLICA_SEED_STRIDE``) that is
passed into and out of every generation call. With ``age_tolerance: 0`` and one replica the source
therefore draws, generates and scores exactly what the synchronous source would, in the same order.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from openrft.data.records import Example
from openrft.data.sampler import EpochSampler
from openrft.engine.rollouts import RolloutGroup, reward_samples, split_outcomes
from openrft.engine.staleness import StalenessManager
from openrft.engine.sync_check import SyncChecker
from openrft.rewards.runner import RewardRunner
from openrft.rollout.replicas import GenerationReplica
from openrft.rollout.types import Completion, SamplingParams

REPLICA_SEED_STRIDE = 1_000_033
MAX_REGENERATIONS = 8  # drops of one prompt in a row that mean a replica is stuck on an old policy


@dataclass
class _Chunk:
    replica: int
    items: list[tuple[int, int]]  # (sequence number, example index)
    version: int
    step: int
    rng_state: Any | None
    open: set[int] = field(default_factory=set)  # sequence numbers not yet consumed or dropped


class AsyncRolloutSource:
    """The rollout source of ``off_policy_async`` jobs (see the module docstring)."""

    def __init__(
        self,
        replicas: list[GenerationReplica],
        rewards: RewardRunner,
        sampler: EpochSampler,
        examples: list[Example],
        prompt_ids: list[list[int]],
        params: SamplingParams,
        *,
        batch_size: int,
        age_tolerance: int,
        adapter_state: Callable[[], Any],
        on_event: Callable[[str, str], None] | None = None,
        checker: SyncChecker | None = None,
    ):
        if not replicas:
            raise ValueError("asynchronous rollouts need at least one generation replica")
        self.replicas, self.rewards, self.sampler = replicas, rewards, sampler
        self.examples, self.prompt_ids, self.params = examples, prompt_ids, params
        self.batch_size = batch_size
        self.chunk_size = math.ceil(batch_size / len(replicas))
        self.adapter_state = adapter_state
        self.checker = checker  # the sync probe after each load (engine/sync_check.py)
        self.on_event = on_event or (lambda level, message: None)
        self.staleness = StalenessManager(batch_size, age_tolerance)
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, int]] = deque()  # drawn, not yet admitted (re-issued ones first)
        self._next_seq = 0
        self._regenerated: dict[int, int] = {}  # sequence number -> times dropped
        self._ready: list[tuple[int, int, RolloutGroup]] = []  # heap of (sequence number, example index, group)
        self._chunks: list[_Chunk] = []  # admitted chunks with open groups
        self._chunk_of: dict[int, _Chunk] = {}
        self._rng: list[Any | None] = [None] * len(replicas)
        self._weights: Any = None
        self._version = 0
        self._error: BaseException | None = None
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._step = {"dropped": 0, "wait_s": 0.0}

    # the learner's side -------------------------------------------------------------------------

    def next_batch(self, step: int) -> list[RolloutGroup]:
        self._start()
        started = time.perf_counter()
        taken: list[tuple[int, RolloutGroup]] = []
        with self._cond:
            while len(taken) < self.batch_size:
                self._raise_if_failed()
                if not self._ready:
                    self._cond.wait(timeout=1.0)
                    continue
                seq, index, group = heapq.heappop(self._ready)
                chunk = self._chunk_of.pop(seq)
                chunk.open.discard(seq)
                if not chunk.open:
                    self._chunks.remove(chunk)
                if self.staleness.take(group.policy_version):
                    taken.append((seq, group))
                    self._regenerated.pop(seq, None)
                else:  # too old: generate this prompt again with a newer policy
                    self._regenerated[seq] = self._regenerated.get(seq, 0) + 1
                    if self._regenerated[seq] > MAX_REGENERATIONS:
                        raise RuntimeError(
                            f"a prompt's rollouts were too old {MAX_REGENERATIONS} times in a row (policy version "
                            f"{group.policy_version}, learner at {self.staleness.version}, age_tolerance "
                            f"{self.staleness.age_tolerance}): a generation replica does not load new adapters"
                        )
                    self._queue.appendleft((seq, index))
                    self._step["dropped"] += 1
                self._cond.notify_all()
            self._step["wait_s"] += time.perf_counter() - started
            ages = [self.staleness.age(g.policy_version) for _, g in taken]
        self._step["ages"] = ages
        return [group for _, group in sorted(taken, key=lambda item: item[0])]

    def policy_updated(self, version: int) -> None:
        """The learner finished a batch: publish its adapter and move the admission window."""
        weights = self.adapter_state()
        if self.checker is not None:  # the learner's scores of this version, in its own thread
            self.checker.published(version)
        with self._cond:
            self._weights, self._version = weights, version
            self.staleness.batch_trained(version)
            self._cond.notify_all()

    def step_metrics(self) -> dict[str, float]:
        """Policy-age distribution of the last batch, drops, and how long the learner waited."""
        s = self.staleness
        ages = self._step.get("ages") or [0]
        metrics = {f"rollout/policy_age/frac_{a}": ages.count(a) / len(ages) for a in range(s.age_tolerance + 1)}
        seen = s.dropped + s.consumed
        metrics.update(
            {
                "rollout/dropped": float(self._step["dropped"]),
                "rollout/dropped_total": float(s.dropped),
                "rollout/dropped_fraction": s.dropped / seen if seen else 0.0,
                "rollout/wait_s": self._step["wait_s"],
                "rollout/in_flight": float(s.running + s.ready),
            }
        )
        restarts = sum(getattr(r, "restarts", 0) for r in self.replicas)
        metrics["rollout/replica_restarts"] = float(restarts)
        if self.checker is not None:
            metrics.update(self.checker.metrics())
        self._step = {"dropped": 0, "wait_s": 0.0}
        return metrics

    # generation workers -------------------------------------------------------------------------

    def _start(self) -> None:
        if self._threads:
            return
        with self._cond:
            self._weights, self._version = self.adapter_state(), self.staleness.version
        if self.checker is not None:
            self.checker.published(self._version)
        for r in range(len(self.replicas)):
            thread = threading.Thread(target=self._work, args=(r,), name=f"openrft-gen-{r}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self, r: int) -> None:
        replica, loaded = self.replicas[r], None
        while True:
            with self._cond:
                chunk = self._admit(r)
                if chunk is None:
                    return
                weights, version = self._weights, self._version
            try:
                if loaded != version:
                    replica.load_adapter(weights, version)
                    if self.checker is not None:
                        self.checker.check(r, replica, weights, version)
                    loaded = version
                examples = [self.examples[i] for _, i in chunk.items]
                groups, rng_after = replica.generate(
                    [self.prompt_ids[i] for _, i in chunk.items], self.params, chunk.rng_state
                )
                future = self.rewards.submit(reward_samples(examples, groups, chunk.step))
            except BaseException as exc:  # handed to the learner thread
                self._fail(exc)
                return
            with self._cond:
                self._rng[r] = rng_after
            future.add_done_callback(lambda f, c=chunk, e=examples, g=groups: self._scored(c, e, g, f))

    def _admit(self, r: int) -> _Chunk | None:
        """Wait for room under the staleness bound, then take up to a chunk of prompts (lock held)."""
        while not (self._stopping or self._error):
            granted = self.staleness.admit(self.chunk_size)
            if granted:
                items = [self._next_prompt() for _ in range(granted)]
                chunk = _Chunk(
                    r, items, self._version, self.staleness.trained + 1, self._rng[r], {seq for seq, _ in items}
                )
                self._chunks.append(chunk)
                self._chunk_of.update({seq: chunk for seq, _ in items})
                return chunk
            self._cond.wait()
        return None

    def _next_prompt(self) -> tuple[int, int]:
        if not self._queue:
            for index in self.sampler.next_batch():
                self._queue.append((self._next_seq, index))
                self._next_seq += 1
        return self._queue.popleft()

    def _scored(self, chunk: _Chunk, examples: list[Example], groups: list[list[Completion]], future: Future) -> None:
        try:
            outcomes = split_outcomes(groups, future.result())
        except BaseException as exc:
            self._fail(exc)
            return
        with self._cond:
            for (seq, index), example, group, outcome in zip(chunk.items, examples, groups, outcomes):
                heapq.heappush(self._ready, (seq, index, RolloutGroup(example, self.prompt_ids[index], group, outcome)))
            self.staleness.finish(len(chunk.items))
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Prompts drawn and not yet consumed are saved and issued again first on resume, each
        replica's random stream as it was before its oldest unfinished chunk."""
        with self._cond:
            pending = sorted([*self._queue, *((seq, i) for c in self._chunks for seq, i in c.items if seq in c.open)])
            rng = list(self._rng)
            for chunk in reversed(self._chunks):  # oldest chunk of each replica wins
                rng[chunk.replica] = chunk.rng_state
            return {
                "sampler": self.sampler.state_dict(),
                "pending": pending,
                "next_seq": self._next_seq,
                "rng": rng,
                "staleness": self.staleness.state_dict(),
            }

    def load_state_dict(self, state: dict) -> None:
        if self._threads:
            raise RuntimeError("load_state_dict after generation started")
        self.sampler.load_state_dict(state["sampler"])
        self._queue = deque((int(seq), int(i)) for seq, i in state["pending"])
        self._next_seq = int(state["next_seq"])
        self._rng = list(state["rng"]) + [None] * max(0, len(self.replicas) - len(state["rng"]))
        self._rng = self._rng[: len(self.replicas)]
        self.staleness.load_state_dict(state["staleness"])

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=60)
        for replica in self.replicas:
            replica.close()
