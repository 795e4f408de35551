"""Two-level inverse-CDF sampling draws each token with its probability, never one that is filtered out, and
reports the log-prob of the temperature-scaled distribution."""

import math

import pytest
import torch

from openrft.rollout.sampling import BLOCK, draw, sample_tokens

DRAWS = 40_000


def _frequencies(log_weights: torch.Tensor, seed: int = 0) -> torch.Tensor:
    rows = log_weights.expand(DRAWS, -1).contiguous()
    tokens, _ = draw(rows, torch.Generator().manual_seed(seed))
    return torch.bincount(tokens, minlength=log_weights.numel()).double() / DRAWS


def _assert_matches(freq: torch.Tensor, probs: torch.Tensor) -> None:
    """Every frequency within 5 standard errors of its probability, and the chi-square statistic over the support
    below its 99.99th percentile (normal approximation of the chi-square distribution)."""
    probs = probs.double()
    assert freq[probs == 0].sum() == 0
    support = probs > 0
    p, f = probs[support], freq[support]
    assert ((f - p).abs() <= 5 * (p * (1 - p) / DRAWS).sqrt() + 1e-12).all(), (f, p)
    chi2 = float(DRAWS * ((f - p) ** 2 / p).sum())
    dof = int(support.sum()) - 1
    assert chi2 < dof + 3.72 * math.sqrt(2 * dof) + 10, chi2


@pytest.mark.parametrize("size", [7, BLOCK, 3 * BLOCK + 37])  # one short block; whole blocks; whole blocks + tail
def test_draw_frequencies_match_the_weights(size):
    generator = torch.Generator().manual_seed(size)
    probs = torch.rand(size, generator=generator) + 0.1  # uneven weights, each expected a few times at least
    probs[torch.randperm(size, generator=generator)[: size // 3]] = 0  # a third filtered out
    probs[-1] = 0.05  # weight in the last (tail) entry
    probs /= probs.sum()
    _assert_matches(_frequencies(probs.log()), probs)


def test_draw_picks_a_weight_concentrated_in_one_block_or_one_entry():
    size = 4 * BLOCK + 9
    for only in (0, BLOCK - 1, BLOCK, 2 * BLOCK + 5, size - 1):
        log_weights = torch.full((size,), float("-inf"))
        log_weights[only] = 3.0
        assert (_frequencies(log_weights)[only] == 1.0).item(), only
    pair = torch.full((size,), float("-inf"))
    pair[[BLOCK + 1, size - 2]] = torch.tensor([0.25, 0.75]).log()  # two blocks, the second the tail
    freq = _frequencies(pair)
    _assert_matches(freq, pair.exp() / pair.exp().sum())


def test_draw_returns_each_rows_logsumexp_and_is_reproducible():
    log_weights = torch.randn(5, 2 * BLOCK + 11) * 3
    tokens, normaliser = draw(log_weights, torch.Generator().manual_seed(7))
    torch.testing.assert_close(normaliser, torch.logsumexp(log_weights, dim=-1))
    again, _ = draw(log_weights, torch.Generator().manual_seed(7))
    assert torch.equal(tokens, again)
    others = torch.stack([draw(log_weights, torch.Generator().manual_seed(s))[0] for s in range(8)])
    assert len({tuple(row.tolist()) for row in others}) > 1


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_sample_tokens_follows_the_temperature_scaled_softmax(temperature):
    logits = torch.linspace(-2, 2, 2 * BLOCK + 3)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    rows = logits.expand(DRAWS, -1).contiguous()
    tokens, logp = sample_tokens(rows, temperature, 0, 1.0, torch.Generator().manual_seed(1))
    freq = torch.bincount(tokens, minlength=logits.numel()).double() / DRAWS
    _assert_matches(freq, probs)
    torch.testing.assert_close(logp.double(), probs.log()[tokens], atol=1e-5, rtol=0)


def test_filtered_sampling_keeps_to_the_filter_and_reports_unfiltered_log_probs():
    logits = torch.randn(64, 3 * BLOCK)
    expected = torch.log_softmax(logits, dim=-1)
    tokens, logp = sample_tokens(logits, 1.0, 5, 1.0, torch.Generator().manual_seed(3))
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == tokens.unsqueeze(-1)).any(-1).all()
    torch.testing.assert_close(logp, expected.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))


def test_greedy_takes_the_argmax_with_its_log_prob():
    logits = torch.randn(4, BLOCK + 100)
    tokens, logp = sample_tokens(logits, 0.0, 0, 1.0, None)
    assert torch.equal(tokens, logits.argmax(-1))
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).max(-1).values)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_of_broken_logits_is_an_error_naming_the_row(bad):
    logits = torch.randn(3, BLOCK + 5)
    logits[1, 7] = bad
    with pytest.raises(ValueError, match="row 1: its logits are NaN"):
        sample_tokens(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(0))
