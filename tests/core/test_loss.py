"""The clipped surrogate, k3 KL, entropy and token-level aggregation against hand-computed values."""

import math

import pytest
import torch

from openrft.algo import clipped_surrogate, entropy_from_logits, kl_k3, policy_loss_terms


def _ratio_logps(ratios):
    old = torch.zeros(1, len(ratios))
    return torch.log(torch.tensor([ratios])), old


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "clipped"),
    [
        # positive advantage: the ratio is capped at 1 + clip_high = 1.28
        (1.1, 2.0, -2.2, False),
        (1.5, 2.0, -1.28 * 2.0, True),
        (0.5, 2.0, -1.0, False),  # below 1 - clip_low with A > 0: min picks the unclipped 0.5*A
        # negative advantage: the ratio is floored at 1 - clip_low = 0.8
        (0.9, -1.0, 0.9, False),
        (0.5, -1.0, 0.8, True),
        (1.5, -1.0, 1.5, False),  # above 1 + clip_high with A < 0: unclipped (pessimistic) term
        (1.0, 0.0, 0.0, False),
    ],
)
def test_clipped_surrogate_per_token(ratio, advantage, expected_loss, clipped):
    logp, old = _ratio_logps([ratio])
    loss, is_clipped = clipped_surrogate(logp, old, torch.tensor([advantage]), clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert bool(is_clipped.item()) is clipped


def test_clipped_token_has_no_gradient_and_unclipped_has():
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    # d/dlogp of -rho*A = -rho*A for the unclipped token; 0 for the clipped one
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -1.1], rel=1e-5)


def test_kl_k3_hand_values():
    logp = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.3)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2), math.log(0.6)]])
    kl = kl_k3(logp, ref)
    # r = ref/p: 0.5, 1, 2 -> r - log r - 1
    expected = [0.5 - math.log(0.5) - 1, 0.0, 2 - math.log(2) - 1]
    assert kl.tolist()[0] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert (kl >= 0).all()


def test_entropy_of_uniform_and_peaked():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    ent = entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4), rel=1e-6)
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "clipped", "grad"),
    [
        (1.5, -1.0, 1.5, False, 1.5),  # under c = 2: the pessimistic unclipped term, gradient -rho*A
        (3.0, -1.0, 2.0, True, 0.0),  # over c: the loss is c*|A|, no gradient
        (3.0, 1.0, -1.28, True, 0.0),  # positive advantage: the ordinary clip at 1 + clip_high
        (0.5, -1.0, 0.8, True, 0.0),  # below 1 - clip_low: the ordinary clip
    ],
)
def test_dual_clip_bounds_negative_advantages(ratio, advantage, expected_loss, clipped, grad):
    logp = torch.log(torch.tensor([[ratio]])).requires_grad_(True)
    loss, is_clipped = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([advantage]), 0.2, 0.28, dual_clip=2.0)
    loss.sum().backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert bool(is_clipped.item()) is clipped
    assert logp.grad.item() == pytest.approx(grad, rel=1e-5, abs=1e-7)


def test_ratio_sum_and_clipped_count_against_an_anchor():
    # ratios 1.5, 1.1 and 0.5 against the old log-probs, A = +1: the first is clipped at 1.2
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5]]))
    terms = policy_loss_terms(logp, old, torch.tensor([1.0]), torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    assert terms.ratio == pytest.approx(3.1, rel=1e-6)
    assert terms.clipped_tokens == 1
    assert terms.pg_loss == pytest.approx(-(1.2 + 1.1 + 0.5), rel=1e-6)


def test_policy_loss_terms_combine_and_aggregate_over_masked_tokens():
    # two sequences, on-policy (ratio 1): pg per token = -A
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.25], [0.25, 0.25, 0.25]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # 5 response tokens
    entropy = torch.full((2, 3), 0.7)
    terms = policy_loss_terms(
        logp,
        logp.detach(),
        torch.tensor([1.0, -2.0]),
        mask,
        clip_low=0.2,
        clip_high=0.2,
        ref_logp=ref,
        kl_coef=0.1,
        entropy=entropy,
        ent_coeff=0.01,
        loss_scale=2.0,
    )
    pg = 2 * -1.0 + 3 * 2.0  # sum over masked tokens of -A
    kl_first = 0.5 - math.log(0.5) - 1  # ref/p = 0.5 on sequence 1, 1 on sequence 2
    kl = 2 * kl_first
    expected = 2.0 * pg + 0.1 * kl - 0.01 * 0.7 * 5  # loss_scale scales the policy loss only
    assert terms.loss.item() == pytest.approx(expected, rel=1e-5)
    assert terms.pg_loss == pytest.approx(pg)
    assert terms.kl == pytest.approx(kl, rel=1e-5)
    assert terms.tokens == 5
    assert terms.clipped_tokens == 0
