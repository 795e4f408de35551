"""The PPO clip acts whenever a sample's policy differs from the one being updated: stale samples
(against their behaviour log-probs) and the later mini-batches of a step (against the policy before
the step's first update)."""

import pytest
import torch

from openrft.learner import Learner
from openrft.learner.batch import TrainSample
from openrft.learner.learner import mini_batches
from openrft.spec.dialects import load_job
from tests.core.test_data_parallel import _learner, _samples


def _adapter(learner: Learner) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in learner.policy.trainable_parameters()])


def _spec(recipe_factory, **algorithm):
    spec = load_job(recipe_factory(max_steps=1))
    spec.algorithm.kl_loss_coef = 0.0
    spec.optimizer.lr = 1e-5  # a small move (ratios near 1), which a clip of 0 still catches
    spec.rollout.importance_weight_cap = 1e3  # no dual clip (the bound): the tests here are about the ordinary one
    for name, value in algorithm.items():
        setattr(spec.algorithm, name, value)
    return spec


def _stale(learner: Learner, shift: float) -> list[TrainSample]:
    """The test batch as stale samples whose behaviour policy gave every token ``shift`` less log-prob."""
    samples = _samples()
    learner.record_old_logp(samples)
    for s in samples:
        s.behaviour_logp, s.old_logp = [v - shift for v in s.old_logp], None
    return samples


def _train(recipe_factory, samples_of, **algorithm) -> tuple[dict[str, float], torch.Tensor]:
    learner = _learner(_spec(recipe_factory, **algorithm))
    metrics = learner.step(samples_of(learner))
    return metrics, _adapter(learner)


def test_the_clip_acts_on_stale_samples(recipe_factory):
    # ratio exp(0.1) = 1.105 against the behaviour policy: clipped at 1 + 0.0 for a positive advantage
    tight, a = _train(recipe_factory, lambda lr: _stale(lr, 0.1), clip_ratio_high=0.0)
    loose, b = _train(recipe_factory, lambda lr: _stale(lr, 0.1), clip_ratio_high=10.0)
    positive = sum(len(s.response_ids) for s in _samples() if s.advantage > 0)
    total = sum(len(s.response_ids) for s in _samples())
    assert tight["actor/pg_clipfrac"] == pytest.approx(positive / total)
    assert loose["actor/pg_clipfrac"] == 0.0
    assert not torch.equal(a, b)
    assert tight["actor/importance_weight_mean"] == pytest.approx(torch.exp(torch.tensor(0.1)).item(), rel=1e-5)
    assert tight["rollout/mismatch_kl"] > 0


def test_a_stale_sample_whose_policy_did_not_move_weighs_like_a_fresh_one(recipe_factory):
    stale, a = _train(recipe_factory, lambda lr: _stale(lr, 0.0))
    fresh, b = _train(recipe_factory, lambda lr: _samples())
    assert stale["actor/importance_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stale["rollout/mismatch_kl"] == pytest.approx(0.0, abs=1e-6)
    assert "actor/importance_weight_mean" not in fresh
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_one_fresh_update_is_never_clipped_but_later_mini_batches_are(recipe_factory):
    one = [_train(recipe_factory, lambda lr: _samples(), clip_ratio_high=c, clip_ratio_low=c) for c in (0.0, 0.5)]
    assert torch.equal(one[0][1], one[1][1])  # ratio 1 on the only update: the clip has nothing to act on
    assert one[0][0]["actor/pg_clipfrac"] == 0.0

    two = [
        _train(recipe_factory, lambda lr: _samples(), clip_ratio_high=high, clip_ratio_low=low, ppo_mini_batches=2)
        for low, high in ((0.0, 0.0), (1.0, 10.0))
    ]
    assert two[0][0]["actor/updates"] == 2
    # the second half: tokens the first update moved the way of their advantage (about half of them)
    assert two[0][0]["actor/pg_clipfrac"] > 0.1
    assert two[1][0]["actor/pg_clipfrac"] == 0.0
    assert not torch.equal(two[0][1], two[1][1])


def test_mini_batches_are_updates_against_the_policy_before_the_first(recipe_factory):
    """``step`` with two mini-batches equals two manual updates, the second one's ratio taken against
    log-probs recorded before the first update."""
    spec = _spec(recipe_factory, ppo_mini_batches=2, clip_ratio_high=0.0, clip_ratio_low=0.0)
    samples = _samples()
    first, second = mini_batches(samples, 2)
    assert [len(first), len(second)] == [8, 8] and {tuple(s.prompt_ids) for s in first}.isdisjoint(
        {tuple(s.prompt_ids) for s in second}
    )

    stepped = _learner(spec)
    metrics = stepped.step(_samples())

    manual = _learner(spec)
    before = [TrainSample(s.prompt_ids, s.response_ids, s.advantage) for s in second]
    manual.record_old_logp(before)
    for mini in (first, before):
        manual.accumulate(mini, sum(len(s.response_ids) for s in mini))
        manual.apply_update()
    manual.end_step()
    assert torch.equal(_adapter(stepped), _adapter(manual))
    assert stepped.version == manual.version == 1
    assert metrics["actor/pg_clipfrac"] > 0


def test_mini_batches_keep_groups_whole_and_in_order():
    samples = [TrainSample([p], [1], 0.0) for p in (1, 1, 2, 2, 3, 3)]
    assert [[s.prompt_ids[0] for s in m] for m in mini_batches(samples, 2)] == [[1, 1, 2, 2], [3, 3]]
    assert [[s.prompt_ids[0] for s in m] for m in mini_batches(samples, 3)] == [[1, 1], [2, 2], [3, 3]]
    assert len(mini_batches(samples, 10)) == 3  # never more than the groups
