"""Jobs on a real local Ray cluster (started here on 127.0.0.1): the learner and the generation replicas
are actors; a replica killed mid-job is replaced without failing the job or losing a step."""

import json

import pytest
import torch

from openrft.engine import RFTJob
from openrft.engine.checkpoints import CheckpointManager
from openrft.runtime import runtime_for
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD
from tests.local_ray import own_ray_cluster

ray = pytest.importorskip("ray")

FUZZY = RewardSpec.model_validate(FUZZY_REWARD)


@pytest.fixture(scope="module")
def cluster():
    yield from own_ray_cluster(4)


def _spec(recipe_factory, steps, runtime, strategy="sync", tolerance=0, replicas=1):
    spec = load_job(recipe_factory(max_steps=steps, save_steps=steps))
    spec.reward = FUZZY
    spec.rollout.strategy, spec.rollout.age_tolerance = strategy, tolerance
    spec.rollout.generation_replicas, spec.rollout.runtime = replicas, runtime
    spec.runtime.threads = 1  # the same threads in both runs: float sums then agree bit for bit
    return spec


def _final_adapter(run_dir):
    manager = CheckpointManager(run_dir, 10)
    return manager.load_state(manager.latest())["learner"]["adapter"]


@pytest.mark.slow
def test_ray_actors_reproduce_the_local_synchronous_run(cluster, recipe_factory, tmp_path):
    local = _spec(recipe_factory, 2, "local")
    on_ray = _spec(recipe_factory, 2, "ray", "off_policy_async", 0)
    RFTJob(local, tmp_path / "local", show_progress=False).run()
    summary = RFTJob(on_ray, tmp_path / "ray", show_progress=False, runtime=runtime_for(on_ray)).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    expected, got = _final_adapter(tmp_path / "local"), _final_adapter(tmp_path / "ray")
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    # the final adapter was written from the learner actor's files, in PEFT format
    assert (tmp_path / "ray" / "adapter" / "adapter_model.safetensors").exists()
    assert ray.is_initialized()  # the job used the running cluster and left it up


@pytest.mark.slow
def test_two_data_parallel_learners_stay_equal_and_step_like_one(cluster, recipe_factory, tmp_path):
    local = _spec(recipe_factory, 2, "local")
    on_ray = _spec(recipe_factory, 2, "ray", "off_policy_async", 0)
    on_ray.rollout.replicas = 2
    runtime = runtime_for(on_ray)
    seen = {}

    def inspect_learners(step, metrics):
        seen["pids"] = {ray.get(a.pid.remote()) for a in runtime._learners}
        seen[step] = [ray.get(a.adapter_state.remote()) for a in runtime._learners]

    RFTJob(local, tmp_path / "local", show_progress=False).run()
    job = RFTJob(on_ray, tmp_path / "ray", show_progress=False, runtime=runtime, listeners=(inspect_learners,))
    assert job.run()["status"] == "succeeded"
    assert len(seen["pids"]) == 2  # two learner actors, in two processes
    for step in (1, 2):  # every learner applied the same summed gradient: the same weights
        first, second = seen[step]
        assert all(torch.equal(first[name], second[name]) for name in first)
    assert any(not torch.equal(seen[1][0][n], seen[2][0][n]) for n in seen[1][0])  # and they train

    def train_rows(run):
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "actor/pg_loss" in r]

    # the first update is the single learner's on the same rollouts, up to float summation order (after
    # it, Adam's sign-like first steps turn float noise in near-zero gradients into lr-sized differences)
    want, have = train_rows("local")[0], train_rows("ray")[0]
    for key in ("actor/pg_loss", "actor/entropy", "actor/trained_tokens", "actor/grad_norm", "critic/rewards/mean"):
        assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key


@pytest.mark.slow
def test_two_replicas_and_a_replica_killed_mid_job(cluster, recipe_factory, tmp_path):
    spec = _spec(recipe_factory, 5, "ray", "off_policy_async", 1, replicas=2)
    runtime = runtime_for(spec)
    killed = {}

    def kill_a_replica(step, metrics):
        replica = runtime.replicas[0]
        if step == 2:
            killed["pid"] = ray.get(replica.actor.pid.remote())
            ray.kill(replica.actor, no_restart=True)
        if step == 4:
            killed["replacement"] = ray.get(replica.actor.pid.remote())

    events = []
    job = RFTJob(
        spec,
        tmp_path / "run",
        show_progress=False,
        runtime=runtime,
        listeners=(kill_a_replica,),
        on_event=lambda level, message: events.append((level, message)),
    )
    runtime.on_event = job.on_event
    summary = job.run()

    assert summary["status"] == "succeeded" and summary["steps"] == 5
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert rows[-1]["rollout/replica_restarts"] >= 1
    assert any("died; replacing it" in message for _, message in events)
    assert all(r["rollout/policy_age/max"] <= 1 for r in rows[1:])
    assert runtime.replicas[0].restarts == 1 and killed["replacement"] != killed["pid"]


@pytest.mark.slow
def test_data_parallel_mini_batches_take_the_ratio_against_the_policy_before_the_step(cluster, recipe_factory):
    """Two learner actors, two mini-batches a step: the old log-probs of the second mini-batch come from the
    actors before the first update, the clip acts on them, and the actors stay equal."""
    from openrft.learner.batch import TrainSample
    from openrft.runtime.learner_group import GroupLearner, LearnerActor

    spec = _spec(recipe_factory, 1, "ray")
    spec.algorithm.ppo_mini_batches = 2
    spec.algorithm.clip_ratio_low = spec.algorithm.clip_ratio_high = 0.0
    actors = [ray.remote(LearnerActor).remote(spec.model_dump_json()) for _ in range(2)]
    learner = GroupLearner(actors)
    g = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(list(range(5 + p, 12 + p)), torch.randint(5, 60, (3,), generator=g).tolist(), float(k) - 1.5)
        for p in range(4)
        for k in range(4)
    ]
    expected = ray.get(actors[0].old_logp.remote(samples[8:]))  # the policy before the step, for the second half

    metrics = learner.step(samples)
    assert metrics["actor/updates"] == 2 and metrics["actor/pg_clipfrac"] > 0
    assert learner.version == 1
    for sample, want in zip(samples[8:], expected, strict=True):
        # float32 noise only (the logits of a batch of another shape): an update moves these by far more
        assert sample.old_logp == pytest.approx(want, rel=1e-6, abs=1e-6)
    first, second = ray.get([a.adapter_state.remote() for a in actors])
    assert all(torch.equal(first[name], second[name]) for name in first)
    for actor in actors:
        ray.kill(actor)


@pytest.mark.slow
def test_data_parallel_learners_sample_the_synchronous_rollouts_in_shares(cluster, recipe_factory, tmp_path):
    """Synchronous rollouts from the local engine on two learners: each samples a contiguous share of the
    prompts from its own stream, in order, and no generation actor is started (nor placed)."""
    from openrft.models import load_tokenizer
    from openrft.rollout.types import SamplingParams
    from openrft.runtime.learner_group import GroupGenerator, LearnerActor
    from openrft.runtime.placement import generation_actors

    spec = _spec(recipe_factory, 2, "ray")
    spec.rollout.replicas = 2
    assert generation_actors(spec) == 0
    assert generation_actors(_spec(recipe_factory, 2, "ray", "off_policy_async", 0, replicas=3)) == 3
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=6)
    tokenizer = load_tokenizer(spec.model.name_or_path)
    prompts = [tokenizer(text)["input_ids"] for text in ("What is 95-73?", "What is 12+30?", "What is 95-73?")]

    def learners():
        return [ray.remote(LearnerActor).remote(spec.model_dump_json(), i) for i in range(2)]

    def tokens(groups):
        return [[c.token_ids for c in group] for group in groups]

    alone = learners()  # what each learner samples from its fresh stream: the first two prompts, then the third
    expected = tokens(ray.get(alone[0].generate.remote(prompts[:2], params, None)))
    expected += tokens(ray.get(alone[1].generate.remote(prompts[2:], params, None)))
    for actor in alone:
        ray.kill(actor)
    together = learners()
    got = tokens(GroupGenerator(together).generate(prompts, params))
    assert got == expected
    for actor in together:
        ray.kill(actor)
    fresh = learners()  # one prompt each, from fresh streams: only the seeds can tell the two apart
    first, second = tokens(GroupGenerator(fresh).generate(prompts[:1] * 2, params))
    assert first != second
    for actor in fresh:
        ray.kill(actor)

    runtime = runtime_for(spec)
    summary = RFTJob(spec, tmp_path / "run", show_progress=False, runtime=runtime).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert not runtime.replicas  # the learners sampled


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "off_policy_async"])
def test_ray_jobs_sample_from_generation_servers_by_url(cluster, recipe_factory, tmp_path, strategy):
    """``generator_base_url`` on the Ray runtime: the learner is an actor, the rollouts come from the server
    (two replicas, each with its own adapter name), never from in-process models."""
    import httpx

    from tests.server.serve_model import serve_model

    with serve_model("openrft-demo", tmp_path / "server.log", "--allow-load-from", str(tmp_path)) as url:
        spec = _spec(recipe_factory, 2, "ray", strategy, 1 if strategy == "off_policy_async" else 0, replicas=2)
        spec.rollout.generator_base_url = url
        assert spec.rollout.generation_engine == "server"
        runtime = runtime_for(spec)
        summary = RFTJob(spec, tmp_path / "run", show_progress=False, runtime=runtime).run()
        served = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert not runtime.replicas  # no generation actors: the servers generate
    assert {"test-run-r0", "test-run-r1"} <= {name.rsplit("-v", 1)[0] for name in served}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in rows if "actor/pg_loss" in m]
    assert len(trained) == 2
    # the server's fresh samples are corrected against the learner actor's log-probs; a step of stale samples
    # only (off_policy_async) is importance-weighted against its old policy instead, with no correction metrics
    corrected = [m for m in trained if "rollout_correction/missing_logprobs" in m]
    assert len(corrected) == 2 if strategy == "sync" else len(corrected) >= 1
    for m in corrected:
        assert m["rollout_correction/missing_logprobs"] == 0
        if m["rollout/policy_age/max"] == 0:  # every sample fresh: the engine and the learner hold one policy
            assert m["rollout_correction/ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    for m in trained:
        if m not in corrected:
            assert m["rollout/policy_age/mean"] >= 1 and "actor/importance_weight_mean" in m
