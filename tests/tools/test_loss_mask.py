"""The loss mask of multi-turn samples: tokens the model did not sample carry no gradient and no count."""

import torch

from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.learner.batch import TrainSample
from openrft.models import load_causal_lm, load_tokenizer
from openrft.spec.dialects import load_job


def _learner(spec) -> Learner:
    torch.manual_seed(spec.training.seed)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
    return Learner(policy, learner_config(spec, load_tokenizer("openrft-demo").pad_token_id))


class LogitsSpy(Learner):
    """Keeps the response logits of each micro-batch with their gradient."""

    seen: list

    def logits(self, model, mb):
        out = super().logits(model, mb)
        if out.requires_grad:
            out.retain_grad()
            self.seen.append((out, mb))
        return out


def test_masked_tool_tokens_get_exactly_zero_gradient(recipe_factory):
    spec = load_job(recipe_factory(max_steps=1))
    spec.algorithm.kl_loss_coef = 0.01
    spec.algorithm.ent_coeff = 0.01  # every loss term that touches a token
    learner = _learner(spec)
    learner.__class__ = LogitsSpy
    learner.seen = []
    prompt = [5, 6, 7, 8]
    # model tokens, then a tool turn (masked), then model tokens again
    mask = [1, 1, 0, 0, 0, 1, 1]
    samples = [
        TrainSample(prompt, [10, 11, 20, 21, 22, 12, 13], advantage=1.0, loss_mask=mask),
        TrainSample(prompt, [14, 15, 16], advantage=-1.0),
    ]
    assert [s.trained_tokens for s in samples] == [4, 3]
    metrics = learner.step(samples)
    assert metrics["actor/trained_tokens"] == 7.0  # masked tokens are not counted
    ((logits, mb),) = learner.seen
    grad = logits.grad.abs().sum(-1)  # [rows, width]
    row = int((mb.advantages == 1.0).nonzero())
    assert torch.equal(mb.loss_mask[row], torch.tensor(mask, dtype=torch.float32))
    assert torch.all(grad[row, 2:5] == 0.0)  # exactly zero, not small
    assert torch.all(grad[row, [0, 1, 5, 6]] > 0)
    other = 1 - row
    assert torch.all(grad[other, :3] > 0) and torch.all(grad[other, 3:] == 0.0)  # padding


def test_a_masked_sample_equals_its_model_tokens_alone_when_context_is_the_same(recipe_factory):
    """Masking the last tokens of a response is the same gradient as cutting them off."""
    spec = load_job(recipe_factory(max_steps=1))
    prompt = [5, 6, 7, 8]
    cut = [TrainSample(prompt, [10, 11, 12], 1.0), TrainSample(prompt, [13, 14], -1.0)]
    masked = [TrainSample(prompt, [10, 11, 12, 30, 31], 1.0, loss_mask=[1, 1, 1, 0, 0]), cut[1]]
    a, b = _learner(spec), _learner(spec)
    a.accumulate(cut, 5)
    b.accumulate(masked, 5)
    got, want = (torch.cat([g.flatten() for g in learner.gradients()]) for learner in (b, a))
    assert want.norm() > 0
    assert (got - want).norm() <= 1e-4 * want.norm()  # float32 noise of the wider padding only
