"""The losses by name (``algo/losses.py``): each against hand-computed values, its gradient against a
float64 reference computed here from the loss's own derivative, and one registry for jobs and Tinker."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from openrft.algo import losses
from openrft.algo.loss import policy_loss_terms
from openrft.algo.losses import LossBatch, LossConfigError
from openrft.algo.tinker_losses import LOSSES as TINKER_LOSSES
from openrft.algo.tinker_losses import LossInputError, check_inputs
from openrft.algo.tinker_losses import resolve_config as tinker_config

# three tokens sampled at q = 0.4 each, now at p = 0.44, 0.2, 0.8: ratios 1.1, 0.5, 2.0
P, Q, A = [0.44, 0.2, 0.8], [0.4, 0.4, 0.4], [1.0, -1.0, 2.0]


def batch(extra=None, mask=None) -> LossBatch:
    logp = torch.log(torch.tensor([P], dtype=torch.float64))
    return LossBatch(
        logp,
        torch.log(torch.tensor([Q], dtype=torch.float64)),
        torch.tensor([A], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64) if mask is None else torch.tensor([mask], dtype=torch.float64),
        {k: torch.tensor([v], dtype=torch.float64) for k, v in (extra or {}).items()},
    )


def run(name, config=None, **kw):
    settings = losses.resolve_config(name, config)
    loss, clipped = losses.per_token(name, batch(**kw), settings)
    return loss[0].tolist(), clipped[0].tolist()


s3 = 1.1 ** (1 / 3)  # GSPO's sequence ratio over the three tokens: the geometric mean of 1.1, 0.5, 2.0
s2 = math.sqrt(2.2)  # ... over tokens 0 and 2

HAND = [
    # name, config, extra inputs, per-token loss, clipped or masked
    ("importance_sampling", None, None, [-1.1, 0.5, -4.0], [False] * 3),
    # clip(r, 0.8, 1.2) = 1.1, 0.8, 1.2: min(rA, clip(r)A) = 1.1, -0.8, 2.4
    ("ppo", None, None, [-1.1, 0.8, -2.4], [False, True, True]),
    ("ppo", {"clip_low_threshold": 0.4, "clip_high_threshold": 3.0}, None, [-1.1, 0.5, -4.0], [False] * 3),
    ("cispo", None, None, [-1.1 * math.log(0.44), 0.5 * math.log(0.2), -4.0 * math.log(0.8)], [False] * 3),
    (
        "cispo",
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.2},
        None,
        [-1.1 * math.log(0.44), 0.9 * math.log(0.2), -2.4 * math.log(0.8)],
        [False, True, True],
    ),
    (
        "dro",
        None,
        None,
        [
            -(math.log(0.44) - 0.05 * math.log(1.1) ** 2),
            -(-math.log(0.2) - 0.05 * math.log(0.5) ** 2),
            -(2 * math.log(0.8) - 0.05 * math.log(2.0) ** 2),
        ],
        [False] * 3,
    ),
    # GSPO: every token carries s = 1.1^(1/3) = 1.0323, clipped to [0.9997, 1.0004]: min(sA, clip(s)A)
    ("gspo", None, {"sequence_ratio_mask": [1, 1, 1]}, [-1.0004, s3, -2.0008], [True, False, True]),
    ("gspo", None, {"sequence_ratio_mask": [1, 0, 1]}, [-1.0004, s2, -2.0008], [True, False, True]),
    ("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, None, [-s3, s3, -2 * s3], [False] * 3),
    # StableReinforce: the ratio inside [0.5, 2] weighs the token; outside, the token is masked out
    (
        "stable_reinforce",
        {"clip_low_threshold": 0.45, "clip_high_threshold": 2.05},
        None,
        [-1.1, 0.5, -4.0],
        [False] * 3,
    ),
    (
        "stable_reinforce",
        {"clip_low_threshold": 0.6, "clip_high_threshold": 1.5},
        None,
        [-1.1, 0.0, 0.0],
        [False, True, True],
    ),
    # the job's objective: clip(r, 0.8, 1.2) as ppo, and a negative advantage's loss at most c*|A| = 2
    ("grpo", None, None, [-1.1, 0.8, -2.4], [False, True, True]),
    (
        "grpo",
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip": 2.0},
        None,
        [-1.1, 0.8, -2.56],
        [False, True, True],
    ),
    ("cross_entropy", None, {"weights": [1.0, 0.0, 0.5]}, [-math.log(0.44), 0.0, -0.5 * math.log(0.8)], [False] * 3),
]


@pytest.mark.parametrize(("name", "config", "extra", "expected", "clipped"), HAND)
def test_each_loss_against_hand_computed_values(name, config, extra, expected, clipped):
    loss, was_clipped = run(name, config, extra=extra)
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-9)
    assert was_clipped == clipped


def test_gspo_sequence_ratio_counts_only_the_masks_tokens():
    # a job's loss mask leaves token 1 out of the sequence ratio: s = sqrt(1.1 * 2.0)
    loss, _ = run("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, mask=[1, 0, 1])
    assert loss == pytest.approx([-s2, s2, -2 * s2], rel=1e-6)


def reference_gradient(name: str, config, lp: np.ndarray, q: np.ndarray, adv: np.ndarray, extra) -> np.ndarray:
    """d loss / d logp per token, in float64 from each loss's own derivative (not autograd)."""
    r = np.exp(lp - q)
    if name == "importance_sampling":
        return -r * adv
    if name in ("ppo", "grpo"):
        if name == "grpo":
            low, high = 1 - config["clip_ratio_low"], 1 + config["clip_ratio_high"]
        else:
            low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        unclipped_chosen = ~(np.clip(r, low, high) * adv < r * adv)
        grad = np.where(unclipped_chosen, -r * adv, 0.0)
        if name == "grpo" and config["dual_clip"]:
            loss = -np.minimum(r * adv, np.clip(r, low, high) * adv)
            grad = np.where((adv < 0) & (loss > -config["dual_clip"] * adv), 0.0, grad)
        return grad
    if name == "cispo":
        return -np.clip(r, config["clip_low_threshold"], config["clip_high_threshold"]) * adv
    if name == "dro":
        return -(adv - config["beta"] * (lp - q))
    if name == "gspo":
        s = np.exp(np.mean(lp - q))
        low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        unclipped_chosen = ~(np.clip(s, low, high) * adv < s * adv)
        return np.where(unclipped_chosen, -s * adv, 0.0)
    if name == "stable_reinforce":
        inside = (r >= config["clip_low_threshold"]) & (r <= config["clip_high_threshold"])
        return np.where(inside, -r * adv, 0.0)
    if name == "cross_entropy":
        return -extra["weights"]
    raise AssertionError(name)


GRADIENT_CASES = [
    ("importance_sampling", None),
    ("ppo", None),
    ("cispo", None),
    ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("dro", {"beta": 0.5}),
    ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("gspo", None),
    ("stable_reinforce", None),
    ("stable_reinforce", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.25}),
    ("grpo", None),
    ("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip": 1.5}),
    ("cross_entropy", None),
]


@pytest.mark.parametrize(("name", "config"), GRADIENT_CASES)
def test_each_loss_gradient_matches_a_float64_reference(name, config):
    rng = np.random.default_rng(7)
    n = 64
    lp = np.log(rng.uniform(0.05, 0.95, n))
    q = lp + rng.uniform(-0.6, 0.6, n)  # ratios 0.55 to 1.8: every clip and mask bound bites somewhere
    adv = rng.normal(size=n)
    extra = {"weights": rng.uniform(0, 1, n)} if name == "cross_entropy" else {}
    settings = losses.resolve_config(name, config)
    logp = torch.tensor(lp[None], dtype=torch.float32, requires_grad=True)
    lb = LossBatch(
        logp,
        torch.tensor(q[None], dtype=torch.float32),
        torch.tensor(adv[None], dtype=torch.float32),
        torch.ones(1, n),
        {k: torch.tensor(v[None], dtype=torch.float32) for k, v in extra.items()},
    )
    loss, _ = losses.per_token(name, lb, settings)
    loss.sum().backward()
    expected = reference_gradient(name, settings, lp, q, adv, extra)
    assert np.abs(expected).max() > 0.1  # not a vacuous comparison
    np.testing.assert_allclose(logp.grad[0].double().numpy(), expected, rtol=2e-5, atol=2e-6)


def test_one_registry_for_jobs_and_the_tinker_api():
    assert losses.names(jobs=True) == [
        "grpo", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"
    ]  # fmt: skip
    assert list(TINKER_LOSSES) == [
        "cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"
    ]  # fmt: skip
    # a Tinker datum's loss is the registry's per-token loss summed
    lp = torch.log(torch.tensor(P))
    inputs = {"logprobs": torch.log(torch.tensor(Q)), "advantages": torch.tensor(A)}
    value = TINKER_LOSSES["ppo"](lp, inputs, tinker_config("ppo", None))
    assert value.item() == pytest.approx(-1.1 + 0.8 - 2.4, rel=1e-5)
    recorded = {"recorded_logprobs": torch.log(torch.tensor(Q)), "advantages": torch.tensor(A)}
    wide = tinker_config("stable_reinforce", {"clip_low_threshold": 0.4, "clip_high_threshold": 2.5})
    value = TINKER_LOSSES["stable_reinforce"](lp, recorded, wide)
    assert value.item() == pytest.approx(-1.1 + 0.5 - 4.0, rel=1e-5)


def test_the_job_objective_through_the_registry_is_the_clipped_surrogate():
    """policy_loss_terms with a named loss sums the registry's per-token loss over the mask."""
    logp = torch.log(torch.tensor([P, P]))
    old = torch.log(torch.tensor([Q, Q]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    terms = policy_loss_terms(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.2, loss_fn="ppo", loss_config=tinker_config("ppo", None)
    )
    # row 0 (A = 1): -1.1, -0.5 (min picks the unclipped 0.5), token 2 masked; row 1 (A = -1): 1.1, 0.8, 2.0
    assert terms.loss.item() == pytest.approx(-1.1 - 0.5 + 1.1 + 0.8 + 2.0, rel=1e-5)
    assert terms.clipped_tokens == 1  # row 1's token 1 (r 0.5 floored at 0.8)
    default = policy_loss_terms(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert default.loss.item() == pytest.approx(terms.loss.item(), rel=1e-6)  # grpo at 0.2 = ppo at 0.8, 1.2


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dppo", None, "loss_fn 'dppo' is not supported; supported: cross_entropy, importance_sampling"),
        ("ppo", {"clip_lo": 0.5}, r"loss_fn_config.clip_lo is not a setting of ppo \(allowed: clip_low_threshold"),
        ("ppo", {"clip_low_threshold": 1.5}, "needs 0 <= clip_low_threshold <= clip_high_threshold, got 1.5, 1.2"),
        ("dro", {"beta": -1}, "beta must be >= 0, got -1"),
        ("gspo", {"clip_high_threshold": float("nan")}, "loss_fn_config.clip_high_threshold must be a finite number"),
        ("cispo", {"clip_low_threshold": "low"}, "must be a finite number, got 'low'"),
        ("grpo", None, "loss_fn 'grpo' is not supported"),  # the job's objective, not a Tinker loss
    ],
)
def test_bad_names_and_settings_are_refused_by_name(name, config, message):
    with pytest.raises(LossInputError, match=message):
        tinker_config(name, config)


def test_a_job_cannot_name_a_tinker_only_loss():
    with pytest.raises(LossConfigError, match="'cross_entropy' is not supported; supported: grpo, importance_sampling"):
        losses.resolve_config("cross_entropy", None, jobs=True)


def test_tinker_inputs_optional_and_unknown():
    length = 3
    ok = {"target_tokens": torch.zeros(3, dtype=torch.long), "advantages": torch.zeros(3)}
    check_inputs("stable_reinforce", ok | {"logprobs": torch.zeros(3)}, length, 0)  # optional
    with pytest.raises(LossInputError, match=r"data\[0\].loss_fn_inputs lacks sequence_ratio_mask: gspo needs"):
        check_inputs("gspo", ok | {"logprobs": torch.zeros(3)}, length, 0)
    with pytest.raises(LossInputError, match=r"weights is not an input of stable_reinforce .*optional: logprobs"):
        check_inputs("stable_reinforce", ok | {"weights": torch.zeros(3)}, length, 0)
