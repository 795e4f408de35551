"""The asynchronous loop on the demo model: age_tolerance 0 is the synchronous loop, bit for bit;
with a larger tolerance and a slow replica, stale groups are dropped and regenerated."""

import json
import time

import torch

from openrft.data.sampler import EpochSampler
from openrft.engine import RFTJob, StopAfter
from openrft.engine.async_rollouts import AsyncRolloutSource
from openrft.engine.checkpoints import CheckpointManager
from openrft.engine.setup import build_parts
from openrft.rewards.runner import RewardRunner
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.replicas import GeneratorReplica
from openrft.rollout.types import SamplingParams
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD

FUZZY = RewardSpec.model_validate(FUZZY_REWARD)


def _spec(recipe_factory, steps, strategy="sync", tolerance=0, replicas=1):
    spec = load_job(recipe_factory(max_steps=steps, save_steps=1))
    spec.reward = FUZZY
    spec.rollout.strategy, spec.rollout.age_tolerance = strategy, tolerance
    spec.rollout.generation_replicas = replicas
    return spec


def _adapters(run_dir):
    manager = CheckpointManager(run_dir, 10)
    return {i.step: manager.load_state(i)["learner"]["adapter"] for i in manager.list()}


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


SAME = (
    "critic/rewards/mean",
    "critic/rewards/max",
    "response_length/mean",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "val-score/rewards/mean@1",
)


def test_tolerance_zero_reproduces_the_synchronous_loop_and_resumes_exactly(recipe_factory, tmp_path):
    sync_spec = _spec(recipe_factory, 3)
    async_spec = _spec(recipe_factory, 3, "off_policy_async", 0)
    RFTJob(sync_spec, tmp_path / "sync", show_progress=False).run()
    RFTJob(async_spec, tmp_path / "async", show_progress=False).run()

    sync_rows, async_rows = _rows(tmp_path / "sync"), _rows(tmp_path / "async")
    assert len(sync_rows) == len(async_rows) == 4
    assert any(r["critic/rewards/max"] > r["critic/rewards/min"] for r in sync_rows[1:])  # real updates
    for a, b in zip(sync_rows, async_rows):
        for name in SAME:
            assert a.get(name) == b.get(name), (a["step"], name)
    for row in async_rows[1:]:
        assert row["rollout/policy_age/max"] == 0 and row["rollout/policy_age/frac_0"] == 1.0
        assert row["rollout/dropped_total"] == 0
    sync_adapters, async_adapters = _adapters(tmp_path / "sync"), _adapters(tmp_path / "async")
    assert sorted(sync_adapters) == sorted(async_adapters) == [1, 2, 3]
    for step, expected in sync_adapters.items():
        assert expected.keys() == async_adapters[step].keys()
        for name in expected:
            assert torch.equal(expected[name], async_adapters[step][name]), (step, name)
    assert any(v.abs().sum() > 0 for k, v in async_adapters[3].items() if "lora_B" in k)

    # interrupted after step 1 and resumed, the asynchronous run continues exactly
    interrupted = tmp_path / "interrupted"
    RFTJob(async_spec, interrupted, show_progress=False, control=StopAfter(1)).run()
    RFTJob.from_run_dir(interrupted, show_progress=False).run()
    resumed = _adapters(interrupted)[3]
    for name, value in sync_adapters[3].items():
        assert torch.equal(value, resumed[name]), name


class SlowReplica(GeneratorReplica):
    """A replica on a slower machine: every generation call takes ``delay_s`` longer."""

    def __init__(self, generator, name, seed, delay_s):
        super().__init__(generator, name, seed)
        self.delay_s = delay_s

    def generate(self, prompts, params, rng_state):
        time.sleep(self.delay_s)
        return super().generate(prompts, params, rng_state)


def test_stale_groups_are_dropped_counted_and_regenerated(recipe_factory):
    """A replica three times slower than the learner's step: its groups arrive too old and are dropped;
    their prompts are generated again, nothing is lost and nothing is consumed twice."""
    spec = _spec(recipe_factory, 1)
    parts = build_parts(spec)
    tokenizer = parts.tokenizer
    fast = GeneratorReplica(
        TransformersGenerator(parts.model, tokenizer, parts.eos_ids, tokenizer.pad_token_id), "fast", 1
    )
    slow = SlowReplica(
        TransformersGenerator(parts.model, tokenizer, parts.eos_ids, tokenizer.pad_token_id), "slow", 2, delay_s=1.5
    )
    for replica in (fast, slow):  # the weights do not change here, only the version they are published as
        replica.load_adapter = lambda weights, version, g=replica.generator: g.set_policy_version(version)
    batch, examples = 4, parts.datasets.train[:12]
    rewards = RewardRunner(parts.reward)
    source = AsyncRolloutSource(
        [fast, slow],
        rewards,
        EpochSampler(len(examples), batch, False, 0),
        examples,
        parts.train_prompts[:12],
        SamplingParams(n=2, max_new_tokens=4),
        batch_size=batch,
        age_tolerance=1,
        adapter_state=lambda: {},
    )
    try:
        consumed, dropped = [], 0
        for step in range(1, 11):
            groups = source.next_batch(step)
            assert len(groups) == batch
            consumed += groups
            assert all(0 <= step - 1 - g.policy_version <= 1 for g in groups)  # never older than the tolerance
            time.sleep(0.4)  # the learner's update
            source.policy_updated(step)
            metrics = source.step_metrics()
            dropped += metrics["rollout/dropped"]
            assert metrics["rollout/policy_age/frac_0"] + metrics["rollout/policy_age/frac_1"] == 1.0
        assert dropped == source.staleness.dropped > 0  # the slow replica's groups arrived too late
        assert metrics["rollout/dropped_fraction"] == dropped / (dropped + 40)
        # every prompt drawn (the stream is unshuffled: seq i is example i mod 12) is consumed once or pending
        state = source.state_dict()
        pending = [index for _, index in state["pending"]]
        drawn = [i % len(examples) for i in range(state["next_seq"])]
        assert sorted([examples.index(g.example) for g in consumed] + pending) == sorted(drawn)
        assert len({seq for seq, _ in state["pending"]}) == len(pending)
    finally:
        source.close()
        rewards.close()


def test_learner_replicas_on_the_local_runtime_are_reported(recipe_factory, tmp_path):
    spec = load_job(recipe_factory(max_steps=1))
    spec.rollout.replicas = 3
    events = []
    job = RFTJob(
        spec, tmp_path / "run", show_progress=False, on_event=lambda level, message: events.append((level, message))
    )
    assert job.run()["status"] == "succeeded"
    assert (
        "warn",
        "rollout.replicas is 3: the local runtime trains with one learner (rollout.runtime ray runs that "
        "many data-parallel learners)",
    ) in events


def test_the_clip_acts_on_stale_rollouts_and_their_weight_is_near_one(recipe_factory, tmp_path):
    """Async with age tolerance 2: stale groups are trained against their behaviour policy, so
    clip_ratio_high changes the update (0.0 clips every stale token whose probability rose with a
    positive advantage; 10.0 none), and their mean ratio stays near 1 when the policy moves little."""
    runs = {}
    for clip in (0.0, 10.0):
        spec = _spec(recipe_factory, 4, "off_policy_async", 2)
        spec.algorithm.clip_ratio_high, spec.algorithm.kl_loss_coef = clip, 0.0
        spec.optimizer.lr = 1e-6  # the policy barely moves between steps (B matrices at 64x: LoRA+)
        spec.evaluation.at_start = False
        RFTJob(spec, tmp_path / str(clip), show_progress=False).run()
        rows = [r for r in _rows(tmp_path / str(clip)) if "actor/pg_loss" in r]
        runs[clip] = (rows, _adapters(tmp_path / str(clip))[4])
    for clip, (rows, _) in runs.items():
        stale = [r for r in rows if r["rollout/policy_age/max"] > 0]
        assert stale, clip  # a mixed-age or stale batch on some step
        for r in stale:
            assert abs(r["actor/importance_weight_mean"] - 1) < 0.05
            assert r["rollout/mismatch_kl"] < 0.01
        clipped = [r["actor/pg_clipfrac"] for r in stale]
        assert (min(clipped) > 0) if clip == 0.0 else (max(clipped) == 0)
    tight, loose = runs[0.0][1], runs[10.0][1]
    assert any(not torch.equal(tight[name], loose[name]) for name in tight)
