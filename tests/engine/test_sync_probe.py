"""The sync probe in real jobs on the demo model with in-process generation replicas (asynchronous rollouts, each
replica its own copy of the policy): a correct sync passes with its metric in metrics.jsonl every step; a
replica planted with a fault (the sync skipped, so it keeps the old adapter; full weights scaled by 1.01) fails
the job with an error naming the replica, the version and the difference; a sync that fails once is repaired by
the one re-load."""

from __future__ import annotations

import json
import re

import pytest
import torch

from openrft.engine import RFTJob
from openrft.engine.local_runtime import LocalRuntime
from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.sync_probe import TOLERANCES
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD


class FaultyReplica:
    """A real in-process replica whose loads go wrong as ``fault`` says (the fault planted, the rest real)."""

    def __init__(self, replica, fault: str, failures: int = 10**9):
        self.replica, self.name, self.fault, self.failures = replica, replica.name, fault, failures
        self.loads = 0

    def load_adapter(self, weights, version: int) -> None:
        self.loads += 1
        if self.loads == 1 or self.failures <= 0:  # the first load (version 0) and loads after the faults
            self.replica.load_adapter(weights, version)
            return
        self.failures -= 1
        if self.fault == "skip":  # the sync skipped: the old weights stay (in-process: the new version claimed)
            scorer = getattr(self.replica, "scorer", None)  # None: a Ray replica (the actor keeps its version)
            if scorer is not None:
                getattr(scorer, "generator", scorer).set_policy_version(version)
        elif self.fault == "scale":  # every weight 1.01 times what the learner has
            self.replica.load_adapter({k: v * 1.01 for k, v in weights.items()}, version)

    def generate(self, prompts, params, rng_state):
        return self.replica.generate(prompts, params, rng_state)

    def score(self, probe):
        return self.replica.score(probe)

    @property
    def probe_engine(self):
        return self.replica.probe_engine

    def close(self) -> None:
        self.replica.close()


class PlantedRuntime(LocalRuntime):
    def __init__(self, fault: str, failures: int = 10**9):
        self.fault, self.failures = fault, failures

    def generation_replicas(self, spec, parts, learner, run_dir):
        replicas = super().generation_replicas(spec, parts, learner, run_dir)
        return [FaultyReplica(replicas[0], self.fault, self.failures), *replicas[1:]]


def _spec(recipe_factory, steps=3, full_rank=False):
    spec = load_job(recipe_factory(max_steps=steps, save_steps=100))
    spec.reward = RewardSpec.model_validate(FUZZY_REWARD)
    spec.rollout.strategy, spec.rollout.age_tolerance = "off_policy_async", 0
    spec.evaluation.at_start = False
    if full_rank:
        spec.lora = spec.lora.model_copy(update={"enabled": False})
        spec.optimizer = spec.optimizer.model_copy(update={"learning_rate": 1e-4})
    return spec


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("full_rank", [False, True], ids=["lora", "full"])
def test_a_correct_sync_passes_with_its_metric_every_step(recipe_factory, tmp_path, full_rank):
    spec = _spec(recipe_factory, full_rank=full_rank)
    RFTJob(spec, tmp_path / "run", show_progress=False).run()
    rows = [r for r in _rows(tmp_path / "run") if "perf/time_per_step" in r]
    assert len(rows) == 3
    tolerance = TOLERANCES[("transformers", "float32")]
    for row in rows:
        assert 0 <= row["sync/max_logprob_diff"] <= tolerance
        assert row["sync/max_logprob_diff/replica_0"] == row["sync/max_logprob_diff"]
        assert row["sync/probe_s"] > 0


@pytest.mark.parametrize(("fault", "full_rank"), [("skip", False), ("skip", True), ("scale", True)])
def test_a_planted_fault_fails_the_job_naming_the_replica_version_and_difference(
    recipe_factory, tmp_path, fault, full_rank
):
    events = []
    job = RFTJob(
        _spec(recipe_factory, full_rank=full_rank),
        tmp_path / "run",
        show_progress=False,
        runtime=PlantedRuntime(fault),
        on_event=lambda level, message: events.append((level, message)),
    )
    with pytest.raises(SyncProbeError) as caught:
        job.run()
    message = str(caught.value)
    match = re.search(r"replica (\S+) serves policy version (\d+) .* differ from the learner's by (\S+) on", message)
    assert match, message
    assert match.group(1) == "thread-0" and int(match.group(2)) >= 1
    assert float(match.group(3)) > TOLERANCES[("transformers", "float32")]
    assert any("loading the weights again" in m for level, m in events if level == "warn")  # re-synced once first


def test_a_sync_that_fails_once_is_repaired_by_the_reload(recipe_factory, tmp_path):
    events = []
    job = RFTJob(
        _spec(recipe_factory, steps=2),
        tmp_path / "run",
        show_progress=False,
        runtime=PlantedRuntime("skip", failures=1),
        on_event=lambda level, message: events.append((level, message)),
    )
    assert job.run()["status"] == "succeeded"
    warnings = [m for level, m in events if level == "warn" and "sync probe" in m]
    assert len(warnings) == 1 and "thread-0 (policy version 1)" in warnings[0]
    rows = [r for r in _rows(tmp_path / "run") if "perf/time_per_step" in r]
    assert all(r["sync/max_logprob_diff"] <= TOLERANCES[("transformers", "float32")] for r in rows)


def test_the_probe_can_be_turned_off(recipe_factory, tmp_path):
    spec = _spec(recipe_factory, steps=1)
    spec.rollout.sync_probe.enabled = False
    RFTJob(spec, tmp_path / "run", show_progress=False, runtime=PlantedRuntime("skip")).run()
    assert not any(k.startswith("sync/") for row in _rows(tmp_path / "run") for k in row)


def test_scaled_weights_change_the_probe(recipe_factory):
    """The 1.01 fault is visible to the probe at all: the demo model's log-probs move by more than the tolerance."""
    from openrft.engine.setup import build_parts
    from openrft.rollout.sync_probe import max_abs_diff, probe_from_prompts, score_with_model

    parts = build_parts(_spec(recipe_factory))
    probe = probe_from_prompts(parts.train_prompts)
    before = score_with_model(parts.model, probe)
    with torch.no_grad():
        for p in parts.model.parameters():
            p.mul_(1.01)
    assert max_abs_diff(score_with_model(parts.model, probe), before) > TOLERANCES[("transformers", "float32")]


def test_the_probe_scores_at_a_measured_thread_count_and_leaves_the_callers(recipe_factory):
    """The first scoring of a model measures the thread count it scores at (each count's scores the same to float
    rounding), later ones use it; the caller's own count is as it was."""
    from openrft.engine.setup import build_parts
    from openrft.rollout import sync_probe
    from openrft.rollout.sync_probe import max_abs_diff, probe_from_prompts, score_once, score_with_model

    parts = build_parts(_spec(recipe_factory))
    probe = probe_from_prompts(parts.train_prompts)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        exact = score_once(parts.model, probe)
        assert max_abs_diff(score_with_model(parts.model, probe), exact) < 1e-5
        assert sync_probe._PROBE_THREADS[parts.model] in (1, 2)
        assert torch.get_num_threads() == 2
        sync_probe._PROBE_THREADS[parts.model] = 1  # whichever won: a later scoring at that count
        assert max_abs_diff(score_with_model(parts.model, probe), exact) < 1e-5
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_thread_count_is_the_fastest_runs_not_one_held_up(monkeypatch):
    """A count whose runs are faster wins even when one of them was held up (by another thread, a collection): with
    the least sum of runs, 2 threads (8 ms each) would win over 1 (3 ms, once 30 ms)."""
    from openrft.rollout import sync_probe

    clock = {"now": 0.0}
    runs_at_one = iter([3e-3, 3e-3, 30e-3, 3e-3])  # the unmeasured first run, then the trials

    def score_at(model, probe, threads):
        clock["now"] += next(runs_at_one) if threads == 1 else 8e-3
        return [[float(threads)]]

    monkeypatch.setattr(sync_probe, "score_at_threads", score_at)
    monkeypatch.setattr(sync_probe.time, "perf_counter", lambda: clock["now"])
    threads, scores = sync_probe.fastest_threads(torch.nn.Linear(1, 1), None, 2)
    assert threads == 1 and scores == [[1.0]]


def test_the_probe_is_the_end_of_each_prompt_and_the_start_of_another():
    from openrft.rollout.sync_probe import PROBE_CONTEXT, probe_from_prompts

    prompts = [list(range(100 * i, 100 * i + 30)) for i in range(1, 5)]
    probe = probe_from_prompts(prompts, count=2, tokens=5)
    assert probe.prompts == [prompts[0][-PROBE_CONTEXT:], prompts[1][-PROBE_CONTEXT:]]
    assert probe.continuations == [prompts[2][:5], prompts[3][:5]]
    assert probe_from_prompts([[1, 2, 3]], count=2).prompts == [[1, 2, 3]]  # a prompt shorter than the context


def test_a_replica_check_waits_for_the_learners_scores_of_its_version(recipe_factory):
    """The engine rollout source lets the learner score while replicas load and score: a check that comes first
    waits for the learner's scores, and fails with the learner's error when its scoring fails."""
    import threading

    from openrft.engine.local_runtime import shared_base_copy
    from openrft.engine.setup import build_parts
    from openrft.engine.sync_check import SyncChecker
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.replicas import GeneratorReplica
    from openrft.rollout.sync_probe import probe_from_prompts, score_with_model

    parts = build_parts(_spec(recipe_factory))
    pad = parts.tokenizer.pad_token_id
    replica = GeneratorReplica(
        TransformersGenerator(shared_base_copy(parts.model), parts.tokenizer, parts.eos_ids, pad), "thread-0"
    )
    learner_may_score = threading.Event()

    def learner_scores(probe):
        learner_may_score.wait(timeout=30)
        if probe is failing:
            raise RuntimeError("the learner's actor died")
        return score_with_model(parts.model, probe)

    failing = None
    checker = SyncChecker(probe_from_prompts(parts.train_prompts), learner_scores)
    results = []
    check = threading.Thread(target=lambda: results.append(checker.check(0, replica, None, 1)))
    check.start()
    check.join(timeout=2)
    assert check.is_alive()  # scored, waiting for the learner's scores of version 1
    learner_may_score.set()
    checker.published(1)
    check.join(timeout=30)
    assert len(results) == 1 and results[0] <= TOLERANCES[("transformers", "float32")]
    assert checker.metrics()["sync/probe_learner_s"] > 0

    failing = checker.probe
    errors = []

    def check_version_2():
        try:
            checker.check(0, replica, None, 2)
        except RuntimeError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=check_version_2)
    waiting.start()
    with pytest.raises(RuntimeError, match="actor died"):
        checker.published(2)
    waiting.join(timeout=30)
    assert len(errors) == 1 and "scoring of policy version 2 failed" in str(errors[0])
