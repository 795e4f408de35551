"""The sync probe run after every weight sync (``rollout/sync_probe.py`` holds the probe and its tolerances).

The learner scores the probe once per policy version, in the learner's thread, when the version is
published (its weights are then exactly that version's); each replica scores it right after loading that
version. Above the tolerance the replica is loaded again, once; still above it, the job fails naming the
replica, the version it serves and the difference. Each step's metrics hold the largest difference seen
since the previous step, over all replicas (``sync/max_logprob_diff``) and per replica
(``sync/max_logprob_diff/replica_N``; a replica not probed since, which happens with asynchronous rollouts
when its load lands after the step's metrics, repeats its last figure), and the seconds spent probing
(``sync/probe_s``).
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
        self._lock = threading.Lock()
        self._diffs: dict[int, float] = {}  # per replica, the largest since the last metrics
        self._last: dict[int, float] = {}  # what the last metrics said: repeated for a replica not probed since
        self._seconds = 0.0

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
        """The learner is at ``version`` now (call from the learner's thread): its scores of the probe."""
        with self._lock:
            if version in self._references:
                return
        started = time.perf_counter()
        scores = self.learner_scores(self.probe)
        with self._lock:
            self._references = {v: s for v, s in self._references.items() if v >= version - 8}  # old ones go
            self._references[version] = scores
            self._seconds += time.perf_counter() - started

    def check(self, index: int, replica: Any, weights: Any, version: int) -> float:
        """Probe ``replica`` (number ``index``), which has just loaded ``weights`` as ``version``; re-load once
        above the tolerance, then fail. The difference."""
        score = getattr(replica, "score", None)
        if score is None:
            return float("nan")
        with self._lock:
            reference = self._references.get(version)
        if reference is None:
            raise RuntimeError(f"the sync probe has no learner scores of policy version {version}")
        tolerance = self.tolerance if self.tolerance is not None else tolerance_for(*replica.probe_engine)
        started = time.perf_counter()
        diff = max_abs_diff(score(self.probe), reference)
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
        """The largest differences since the last call, overall and per replica, and the probing time."""
        with self._lock:
            diffs, seconds = {**self._last, **self._diffs}, self._seconds
            self._last, self._diffs, self._seconds = diffs, {}, 0.0
        if not diffs:
            return {}
        metrics = {f"sync/max_logprob_diff/replica_{i}": d for i, d in sorted(diffs.items())}
        metrics["sync/max_logprob_diff"] = max(diffs.values())
        metrics["sync/probe_s"] = seconds
        return metrics
