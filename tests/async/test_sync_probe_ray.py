"""The sync probe on a real local Ray cluster: generation replicas are actors with their own model, the learner an
actor that scores the probe; a correct sync passes, a replica planted with the sync skipped fails the job naming
it (the planted replica: tests/engine/test_sync_probe.py)."""

import json
import re

import pytest

from openrft.engine import RFTJob
from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.sync_probe import TOLERANCES
from openrft.runtime.ray_runtime import RayRuntime
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD
from tests.engine.test_sync_probe import FaultyReplica
from tests.local_ray import own_ray_cluster

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    yield from own_ray_cluster(3)


class SkippingRayRuntime(RayRuntime):
    def generation_replicas(self, spec, parts, learner, run_dir):
        replicas = super().generation_replicas(spec, parts, learner, run_dir)
        return [FaultyReplica(replicas[0], "skip"), *replicas[1:]]


def _spec(recipe_factory):
    spec = load_job(recipe_factory(max_steps=2, save_steps=2))
    spec.reward = RewardSpec.model_validate(FUZZY_REWARD)
    spec.rollout.strategy, spec.rollout.age_tolerance, spec.rollout.runtime = "off_policy_async", 0, "ray"
    spec.evaluation.at_start = False
    spec.runtime.threads = 1
    return spec


@pytest.mark.slow
def test_ray_replicas_are_probed_and_a_skipped_sync_is_caught(cluster, recipe_factory, tmp_path):
    spec = _spec(recipe_factory)
    RFTJob(spec, tmp_path / "good", show_progress=False, runtime=RayRuntime(spec)).run()
    rows = [json.loads(line) for line in (tmp_path / "good" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/time_per_step" in r]
    assert len(rows) == 2
    assert all(r["sync/max_logprob_diff/replica_0"] <= TOLERANCES[("transformers", "float32")] for r in rows)

    spec = _spec(recipe_factory)
    with pytest.raises(SyncProbeError) as caught:
        RFTJob(spec, tmp_path / "bad", show_progress=False, runtime=SkippingRayRuntime(spec)).run()
    match = re.search(r"replica (\S+) serves policy version (\d+) .* by (\S+) on the sync probe", str(caught.value))
    assert match and match.group(1) == "ray-0" and match.group(2) == "1", str(caught.value)
    assert float(match.group(3)) > TOLERANCES[("transformers", "float32")]
