"""Rollout correction (algo/rollout_correction.py) against hand-computed values, and in the learner."""

import math

import pytest
import torch

from openrft.algo.loss import policy_loss_terms
from openrft.algo.rollout_correction import correction_metrics, correction_sums, correction_weights, support_log_probs
from openrft.spec.job import RolloutCorrectionSpec
from tests.core.test_data_parallel import _learner, _samples
from tests.core.test_objective import _adapter, _spec

NAN = float("nan")
# learner -1.0, -2.0, -0.5; engine -1.2, -1.0, missing: log-ratios 0.2, -1.0, (neutral)
TRAINER = torch.tensor([[-1.0, -2.0, -0.5]])
ENGINE = torch.tensor([[-1.2, -1.0, NAN]])
MASK = torch.ones(1, 3)
R1, R2 = math.exp(0.2), math.exp(-1.0)  # 1.2214, 0.3679


def _weights(mode, level, cap, engine=ENGINE, mask=MASK):
    return correction_weights(TRAINER, engine, mask, mode=mode, level=level, cap=cap)


def test_token_tis_truncates_at_the_cap_and_leaves_a_missing_log_prob_neutral():
    result = _weights("tis", "token", 2.0)
    assert result.weights.tolist()[0] == pytest.approx([R1, R2, 1.0], abs=1e-6)
    assert (result.tokens, result.missing, result.truncated_tokens, result.masked_tokens) == (2, 1, 0, 0)
    capped = _weights("tis", "token", 1.1)
    assert capped.weights.tolist()[0] == pytest.approx([1.1, R2, 1.0], abs=1e-6)
    assert capped.truncated_tokens == 1


def test_token_mis_masks_ratios_outside_the_cap_band():
    result = _weights("mis", "token", 2.0)  # band [0.5, 2]: e^-1 = 0.368 is out
    assert result.weights.tolist()[0] == pytest.approx([R1, 0.0, 1.0], abs=1e-6)
    assert result.masked.tolist()[0] == [False, True, False]
    assert result.masked_tokens == 1


def test_sequence_level_uses_the_mean_token_log_ratio():
    seq = math.exp((0.2 - 1.0) / 2)  # 0.6703: the mean over the compared tokens, the missing one left out
    tis = _weights("tis", "sequence", 2.0)
    assert tis.weights.tolist()[0] == pytest.approx([seq] * 3, abs=1e-6)
    kept = _weights("mis", "sequence", 2.0)
    assert kept.weights.tolist()[0] == pytest.approx([seq] * 3, abs=1e-6)
    dropped = _weights("mis", "sequence", 1.4)  # band [0.714, 1.4]: the whole sequence is masked
    assert dropped.weights.tolist()[0] == [0.0, 0.0, 0.0]
    assert dropped.masked_tokens == 3


def test_untrained_tokens_get_no_weight_and_no_statistics():
    result = _weights("tis", "token", 2.0, mask=torch.tensor([[1.0, 0.0, 1.0]]))
    assert result.weights.tolist()[0] == pytest.approx([R1, 0.0, 1.0], abs=1e-6)
    assert (result.tokens, result.missing) == (1, 1)


def test_a_row_without_any_engine_log_prob_is_neutral_at_sequence_level():
    result = _weights("mis", "sequence", 1.1, engine=torch.full((1, 3), NAN))
    assert result.weights.tolist()[0] == [1.0, 1.0, 1.0]
    assert result.missing == 3 and result.masked_tokens == 0


def test_off_weighs_every_trained_token_one():
    assert _weights("off", "token", 2.0).weights.tolist()[0] == [1.0, 1.0, 1.0]


def test_the_mismatch_metrics():
    result = _weights("mis", "token", 2.0)
    metrics = correction_metrics(correction_sums(result), trained_tokens=3)
    mean = (R1 + R2) / 2
    assert metrics["rollout_correction/ratio_mean"] == pytest.approx(mean, abs=1e-6)
    assert metrics["rollout_correction/ratio_std"] == pytest.approx(abs(R1 - R2) / 2, abs=1e-5)
    kl = ((R1 - 1 - 0.2) + (R2 - 1 + 1.0)) / 2  # k3: rho - 1 - log rho, per compared token
    assert metrics["rollout_correction/kl"] == pytest.approx(kl, abs=1e-6)
    assert metrics["rollout_correction/masked_fraction"] == pytest.approx(1 / 3)
    assert metrics["rollout_correction/missing_logprobs"] == 1


def test_a_cap_of_one_or_less_is_refused():
    with pytest.raises(ValueError, match="cap must be above 1"):
        _weights("tis", "token", 1.0)


def test_support_log_probs_renormalise_over_the_truncated_support():
    logits = torch.log(torch.tensor([[[0.4, 0.3, 0.2, 0.1]]]))  # [rows, tokens, vocab]
    target = torch.tensor([[1]])
    assert support_log_probs(logits, target, 2, 1.0).item() == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)
    assert support_log_probs(logits, target, 0, 0.6).item() == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)
    assert support_log_probs(logits, target, 0, 1.0).item() == pytest.approx(math.log(0.3), abs=1e-6)
    # min_p 0.6: kept where p >= 0.6 * 0.4 = 0.24 -> {0.4, 0.3}; token 2 (0.2) is outside
    assert support_log_probs(logits, torch.tensor([[2]]), 0, 1.0, 0.6).item() == -math.inf
    assert support_log_probs(logits, target, 3, 0.8).item() == pytest.approx(math.log(0.3 / 0.9), abs=1e-6)


def test_token_weights_scale_the_policy_loss():
    logp = torch.tensor([[-1.0, -2.0]])
    adv = torch.tensor([1.0])
    plain = policy_loss_terms(logp, logp, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    weighted = policy_loss_terms(
        logp, logp, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2, token_weights=torch.tensor([[0.5, 0.0]])
    )
    assert plain.pg_loss == pytest.approx(-2.0)
    assert weighted.pg_loss == pytest.approx(-0.5)


def _with_engine(learner, shift: float, mode: str, level: str = "token"):
    """The test batch as fresh samples whose engine gave every token ``shift`` less log-prob."""
    learner.config.correction = RolloutCorrectionSpec(mode=mode, level=level, cap=2.0)
    samples = _samples()
    learner.record_old_logp(samples)
    for s in samples:
        s.engine_logp, s.old_logp = [v - shift for v in s.old_logp], None
    return samples


def test_in_the_learner_an_engine_that_agrees_changes_nothing(recipe_factory):
    plain = _learner(_spec(recipe_factory))
    plain.step(_samples())
    corrected = _learner(_spec(recipe_factory))
    metrics = corrected.step(_with_engine(corrected, 0.0, "tis"))
    assert torch.allclose(_adapter(plain), _adapter(corrected), atol=1e-6)
    assert metrics["rollout_correction/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_correction/kl"] == pytest.approx(0.0, abs=1e-6)


def test_in_the_learner_masked_samples_give_no_gradient(recipe_factory):
    learner = _learner(_spec(recipe_factory))
    before = _adapter(learner).clone()
    metrics = learner.step(_with_engine(learner, 1.0, "mis"))  # ratio e^1 = 2.7 > cap 2: all masked
    assert metrics["rollout_correction/masked_fraction"] == 1.0
    assert torch.equal(before, _adapter(learner))
    truncated = _learner(_spec(recipe_factory))
    metrics = truncated.step(_with_engine(truncated, 1.0, "tis"))
    assert metrics["rollout_correction/truncated_fraction"] == 1.0
    assert not torch.equal(before, _adapter(truncated))
