"""Data-parallel learners: shares of a batch, each normalised by the whole batch's tokens, sum to its gradient."""

import pytest
import torch

from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.learner.batch import TrainSample
from openrft.models import load_causal_lm, load_tokenizer
from openrft.spec.dialects import load_job


def _learner(spec, dtype: torch.dtype = torch.float32) -> Learner:
    torch.manual_seed(spec.training.seed)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), dtype)
    tokenizer = load_tokenizer("openrft-demo")
    policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
    return Learner(policy, learner_config(spec, tokenizer.pad_token_id))


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    samples = []
    for prompt in range(4):
        prompt_ids = torch.randint(5, 60, (6 + prompt,), generator=g).tolist()
        for k in range(4):
            response = torch.randint(5, 60, (1 + (prompt + k) % 4,), generator=g).tolist()
            samples.append(TrainSample(prompt_ids, response, advantage=float(k) - 1.5))
    return samples


def test_shares_of_a_batch_sum_to_the_whole_batch_gradient(recipe_factory):
    spec = load_job(recipe_factory(max_steps=1))
    spec.algorithm.kl_loss_coef = 0.01  # with a reference term too
    samples = _samples()
    total = sum(len(s.response_ids) for s in samples)

    whole = _learner(spec)
    whole.accumulate(samples, total)
    expected = whole.gradients()

    parts = _learner(spec)
    summed = None
    for share in (samples[:7], samples[7:]):  # a share boundary inside a group, as the driver may cut
        parts.accumulate(share, total)
        grads = parts.gradients()
        parts.optimizer.zero_grad(set_to_none=True)
        summed = grads if summed is None else [a + b for a, b in zip(summed, grads, strict=True)]
    flat_got, flat_want = torch.cat([g.flatten() for g in summed]), torch.cat([g.flatten() for g in expected])
    assert flat_want.norm() > 0
    # float32 noise only: the shares are padded into other micro-batches than the whole batch
    assert (flat_got - flat_want).norm() <= 1e-5 * flat_want.norm()

    # the same summed gradient applied on two learners gives the same weights
    for learner in (whole, parts):  # what the learners' all-reduce leaves in .grad (clipping scales it in place)
        for param, grad in zip(learner.policy.trainable_parameters(), summed, strict=True):
            param.grad = grad.clone()
    whole.apply_update(), parts.apply_update()
    whole.end_step(), parts.end_step()
    for a, b in zip(whole.policy.trainable_parameters(), parts.policy.trainable_parameters(), strict=True):
        assert torch.equal(a, b)
    assert whole.version == parts.version == 1


def _mixed_age_samples(learner: Learner) -> list[TrainSample]:
    """The batch above with every other group stale: behaviour log-probs near the current policy's."""
    samples = _samples()
    g = torch.Generator().manual_seed(1)
    stale = [s for i, s in enumerate(samples) if (i // 4) % 2 == 1]
    learner.record_old_logp(stale)  # the current policy's log-probs, moved a little: a policy a step behind
    for s in stale:
        noise = 0.3 * torch.randn(len(s.response_ids), generator=g, dtype=torch.float64)
        s.behaviour_logp, s.old_logp = (torch.tensor(s.old_logp, dtype=torch.float64) + noise).tolist(), None
    return samples


def _flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads])


def _gradient(learner: Learner, shares: list[list[TrainSample]], total: int) -> torch.Tensor:
    summed = None
    for share in shares:
        learner.accumulate(share, total)
        grads = _flat(learner.gradients())
        learner.optimizer.zero_grad(set_to_none=True)
        summed = grads if summed is None else summed + grads
    return summed


def test_mixed_age_batches_give_one_gradient_however_split(recipe_factory):
    """A fresh sample weighs 1 and a stale one its ratio to its own behaviour policy, wherever each sits:
    one micro-batch, one per sample, data-parallel shares cutting groups, or fresh and stale apart."""
    spec = load_job(recipe_factory(max_steps=1))
    spec.algorithm.kl_loss_coef = 0.01
    learner = _learner(spec, torch.float64)  # float64: the splits agree far below 1e-6, not only to float32 noise
    samples = _mixed_age_samples(learner)
    stale = [s for s in samples if s.behaviour_logp is not None]
    fresh = [s for s in samples if s.behaviour_logp is None]
    assert stale and fresh
    total = sum(len(s.response_ids) for s in samples)

    learner.config.micro_batch_tokens = 100_000
    whole = _gradient(learner, [samples], total)
    assert len(learner.plan(samples)) == 1
    apart = _gradient(learner, [fresh, stale], total)
    shares = _gradient(learner, [samples[:7], samples[7:13], samples[13:]], total)
    learner.config.micro_batch_tokens = 1  # one sample per micro-batch
    singles = _gradient(learner, [samples], total)

    assert whole.norm() > 0
    for other in (apart, shares, singles):
        assert (other - whole).norm() <= 1e-6 * whole.norm()

    # a fresh sample's weight is exactly 1: its gradient is that of the all-fresh batch's
    learner.config.micro_batch_tokens = 100_000
    fresh_alone = _gradient(learner, [fresh], total)
    stale_alone = _gradient(learner, [stale], total)
    assert (fresh_alone + stale_alone - whole).norm() <= 1e-6 * whole.norm()

    # the metrics: importance weight and mismatch KL over the stale tokens only
    sums = learner.accumulate(samples, total)
    learner.optimizer.zero_grad(set_to_none=True)
    stale_tokens = sum(len(s.response_ids) for s in stale)
    assert sums["stale_tokens"] == stale_tokens
    current = torch.cat([torch.tensor(s.old_logp) for s in _recorded(learner, stale)])
    behaviour = torch.cat([torch.tensor(s.behaviour_logp) for s in stale])
    ratio = torch.exp(current - behaviour)
    assert sums["is_weight"] == pytest.approx(float(ratio.sum()), rel=1e-6)
    delta = behaviour - current
    assert sums["mismatch_kl"] == pytest.approx(float((delta.exp() - delta - 1).sum()), rel=1e-6)


def _recorded(learner: Learner, samples: list[TrainSample]) -> list[TrainSample]:
    """Copies of ``samples`` as fresh ones, with the current policy's log-probs in ``old_logp``."""
    copies = [TrainSample(s.prompt_ids, s.response_ids, s.advantage) for s in samples]
    learner.record_old_logp(copies)
    return copies
