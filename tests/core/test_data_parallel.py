"""Data-parallel learners: shares of a batch, each normalised by the whole batch's tokens, sum to its gradient."""

import torch

from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.learner.batch import TrainSample
from openrft.models import load_causal_lm, load_tokenizer
from openrft.spec.dialects import load_job


def _learner(spec) -> Learner:
    torch.manual_seed(spec.training.seed)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
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
    whole.set_gradients(summed)
    parts.set_gradients(summed)
    whole.apply_update(), parts.apply_update()
    for a, b in zip(whole.policy.trainable_parameters(), parts.policy.trainable_parameters(), strict=True):
        assert torch.equal(a, b)
    assert whole.version == parts.version == 1
