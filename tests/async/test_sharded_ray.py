"""The sharded learner on a real local Ray cluster: two learner actors sharding one policy (FSDP2, gloo)
make one learner's update; a rank killed during a step fails it by name, and the job resumes from its
last checkpoint on one learner."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from openrft.engine import RFTJob
from openrft.runtime import runtime_for
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD
from tests.core.test_data_parallel import _samples
from tests.core.test_sharded import one_learner, relative_update_error, sharded_spec
from tests.local_ray import own_ray_cluster

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    yield from own_ray_cluster(4)


@pytest.mark.parametrize("mode", ["lora"])  # full fine-tuning on Ray: the job test below; both modes: torchrun's
def test_two_learner_actors_make_one_learners_update(cluster, tmp_path, mode):
    from openrft.runtime.ray_sharded import RayShardedLearner
    from openrft.runtime.sharded import ShardedWorker

    spec = sharded_spec(tmp_path, mode)
    actors = [ray.remote(ShardedWorker).options(num_cpus=1).remote(spec.model_dump_json()) for _ in range(2)]
    try:
        sharded = RayShardedLearner(actors)
        assert len(set(sharded.call("pid"))) == 2  # two processes
        metrics = sharded.step(_samples())
        got = ray.get(sharded.adapter_state())
    finally:
        for actor in actors:
            ray.kill(actor)
    learner = one_learner(spec)
    before = learner.policy.adapter_state()
    expected_metrics = learner.step(_samples())
    assert relative_update_error(before, learner.policy.adapter_state(), got) <= 1e-5
    assert metrics["actor/grad_norm"] == pytest.approx(expected_metrics["actor/grad_norm"], rel=1e-5)
    assert sharded.version == 1


def test_a_learner_killed_mid_step_fails_the_step_and_the_job_resumes_on_one_learner(
    cluster, recipe_factory, tmp_path, monkeypatch
):
    from openrft.runtime.ray_sharded import LearnerRankDied, RayShardedLearner

    spec = load_job(recipe_factory(max_steps=3, save_steps=1))
    spec.reward = RewardSpec.model_validate(FUZZY_REWARD)
    spec.rollout.runtime, spec.rollout.replicas, spec.rollout.learner_sharding = "ray", 2, "fsdp"
    spec.lora.enabled = False  # full fine-tuning: the final model in Hugging Face format
    # a generation replica actor samples: after each update it loads the whole gathered model
    spec.rollout.strategy, spec.rollout.age_tolerance = "off_policy_async", 0
    spec.evaluation.at_start = False
    runtime = runtime_for(spec)
    submit = RayShardedLearner.submit
    steps = []

    def submit_then_kill_rank_1_in_step_2(self, method, *args, **kwargs):
        refs = submit(self, method, *args, **kwargs)
        if method == "step":
            steps.append(refs)
            if len(steps) == 2:  # both ranks have the step; rank 1 dies while rank 0 waits on it
                ray.kill(self.actors[1], no_restart=True)
        return refs

    monkeypatch.setattr(RayShardedLearner, "submit", submit_then_kill_rank_1_in_step_2)
    with pytest.raises(LearnerRankDied, match=r"learner rank 1 of 2 .* died during step; the update was not applied"):
        RFTJob(spec, tmp_path / "run", show_progress=False, runtime=runtime).run()
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-000001"]

    monkeypatch.undo()
    spec.rollout.replicas = 1  # the two learners' checkpoint, resharded onto one
    summary = RFTJob(spec, tmp_path / "run", resume=True, show_progress=False, runtime=runtime_for(spec)).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 3
    final = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "adapter"))  # Hugging Face format
    assert final.config.model_type == "qwen2"
    state = torch.load(tmp_path / "run" / "checkpoints" / "step-000003" / "trainer_state.pt", weights_only=False)
    assert state["learner"]["version"] == 3 and state["learner"]["learners"] == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/grad_norm" in r] == [1, 2, 3]
    assert all(r["rollout/policy_age/max"] == 0 for r in rows if "rollout/policy_age/max" in r)
