"""The sync probe run after every weight sync (``rollout/sync_probe.py`` holds the probe and its tolerances).

The learner scores the probe once per policy version, in the learner's thread, when the version is
published (its weights are then exactly that version's, and stay so until the call returns); each replica
scores it right after loading that version, and ``check`` waits for the learner's scores of that version. So
the learner may score while replicas in other processes load and score (the engine rollout source does); an
in-process replica's thread does not score beside the learner's, as two Python threads running a small model's
forward share one interpreter lock and took longer together than one after the other (the demo model: 17
against 12 ms). Above the tolerance the replica is loaded again, once; still above it, the
job fails naming the replica, the version it serves and the difference. Each step's metrics hold the largest
difference seen since the previous step, over all replicas (``sync/max_logprob_diff``) and per replica
(``sync/max_logprob_diff/replica_N``; a replica not probed since, which happens with asynchronous rollouts
when its load lands after the step's metrics, repeats its last figure); the seconds spent probing
(``sync/probe_s``: the learner's scoring, ``sync/probe_learner_s``, and the replicas' checks after their loads,
which include any wait for the learner's scores and any re-load; summed, so above the time it adds to a step
where the two overlap).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from openrft.errors import OpenRFTError
from openrft.rollout.sync_probe import ProbeSet, max_abs_diff, probe_from_prompts, tolerance_for
from openrft.spec.job import SyncProbeSpec

Scores = list[list[float]]

# How long a replica's check waits for the learner's scores of its version (the learner scores a few rows: seconds
# at a real model on CPU; this bounds a learner that never publishes, not a slow one).
REFERENCE_WAIT_S = 600.0


class SyncProbeError(OpenRFTError):
    """A generation replica does not serve the policy the learner published."""


class SyncChecker:
    def __init__(
        self,
        probe: ProbeSet,
        learner_scores: Callable[[ProbeSet], Scores],
        tolerance: float | None = None,
        on_event: Callable[[str, str], None] | None = None,
    ):
        self.probe, self.learner_scores, self.tolerance = probe, learner_scores, tolerance
        self.on_event = on_event or (lambda level, message: None)
        self._references: dict[int, Scores] = {}
        self._failed: dict[int, BaseException] = {}  # versions whose learner scoring raised
        self._lock = threading.Condition()
        self._diffs: dict[int, float] = {}  # per replica, the largest since the last metrics
        self._last: dict[int, float] = {}  # what the last metrics said: repeated for a replica not probed since
        self._seconds = 0.0
        self._learner_seconds = 0.0

    @classmethod
    def for_job(
        cls,
        spec: SyncProbeSpec,
        prompt_ids: list[list[int]],
        learner_scores: Callable[[ProbeSet], Scores] | None,
        on_event: Callable[[str, str], None] | None = None,
    ) -> SyncChecker | None:
        """The job's checker, or None when the probe is off or the learner cannot score it (said once)."""
        if not spec.enabled:
            return None
        if learner_scores is None:
            (on_event or (lambda level, message: None))(
                "warn", "the sync probe is off: this runtime's learner cannot score it (rollout.sync_probe)"
            )
            return None
        return cls(probe_from_prompts(prompt_ids, spec.prompts, spec.tokens), learner_scores, spec.tolerance, on_event)

    def published(self, version: int) -> None:
        """The learner is at ``version`` now (call from the learner's thread, which must not change the weights
        before this returns): its scores of the probe, handed to the replicas' ``check`` waiting for them."""
        with self._lock:
            if version in self._references:
                return
        started = time.perf_counter()
        try:
            scores = self.learner_scores(self.probe)
        except BaseException as exc:  # the replicas waiting for these scores fail with it
            with self._lock:
                self._failed[version] = exc
                self._lock.notify_all()
            raise
        with self._lock:
            self._references = {v: s for v, s in self._references.items() if v >= version - 8}  # old ones go
            self._references[version] = scores
            self._learner_seconds += time.perf_counter() - started
            self._lock.notify_all()

    def _reference(self, version: int) -> Scores:
        """The learner's scores of ``version``, waited for (``published`` runs beside the replicas' loads)."""
        with self._lock:
            ready = self._lock.wait_for(
                lambda: version in self._references or version in self._failed, timeout=REFERENCE_WAIT_S
            )
            if version in self._failed:
                raise RuntimeError(
                    f"the learner's sync-probe scoring of policy version {version} failed"
                ) from self._failed[version]
            if not ready:
                raise RuntimeError(
                    f"the sync probe waited {REFERENCE_WAIT_S:g} s for the learner's scores of policy version "
                    f"{version}: the learner did not publish that version"
                )
            return self._references[version]

    def check(self, index: int, replica: Any, weights: Any, version: int) -> float:
        """Probe ``replica`` (number ``index``), which has just loaded ``weights`` as ``version``; re-load once
        above the tolerance, then fail. The difference."""
        score = getattr(replica, "score", None)
        if score is None:
            return float("nan")
        tolerance = self.tolerance if self.tolerance is not None else tolerance_for(*replica.probe_engine)
        started = time.perf_counter()
        scores = score(self.probe)
        reference = self._reference(version)
        diff = max_abs_diff(scores, reference)
        if diff > tolerance:
            self.on_event(
                "warn",
                f"generation replica {replica.name} (policy version {version}) differs from the learner by "
                f"{diff:.4g} on the sync probe (tolerance {tolerance:g}): loading the weights again",
            )
            replica.load_adapter(weights, version)
            diff = max_abs_diff(score(self.probe), reference)
        with self._lock:
            self._seconds += time.perf_counter() - started
            self._diffs[index] = max(self._diffs.get(index, 0.0), diff)
        if diff > tolerance:
            raise SyncProbeError(
                f"generation replica {replica.name} serves policy version {version} with log-probs that differ "
                f"from the learner's by {diff:.4g} on the sync probe, above the tolerance {tolerance:g} "
                f"({' '.join(replica.probe_engine)}), also after loading the weights again: it does not serve "
                "the learner's policy (an adapter not loaded or cached under a reused name, wrong weights)"
            )
        return diff

    def metrics(self) -> dict[str, float]:
        """The largest differences since the last call, overall and per replica, and the probing times."""
        with self._lock:
            diffs, seconds, learner_seconds = {**self._last, **self._diffs}, self._seconds, self._learner_seconds
            self._last, self._diffs, self._seconds, self._learner_seconds = diffs, {}, 0.0, 0.0
        if not diffs:
            return {}
        metrics = {f"sync/max_logprob_diff/replica_{i}": d for i, d in sorted(diffs.items())}
        metrics["sync/max_logprob_diff"] = max(diffs.values())
        metrics["sync/probe_s"] = seconds + learner_seconds
        metrics["sync/probe_learner_s"] = learner_seconds
        return metrics
