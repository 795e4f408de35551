"""Group advantages against hand-computed values (docs/contracts.md §4)."""

import math

import pytest
import torch

from openrft.algo import group_advantages


def test_grpo_advantage_matches_hand_computation():
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(((.5^2)*4)/3) = sqrt(1/3)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    expected = 0.5 / math.sqrt(1 / 3)
    assert adv.tolist()[0] == pytest.approx([expected, -expected, -expected, expected], rel=1e-6)


def test_uneven_group():
    # rewards 3, 1, 2: mean 2, sample std 1
    adv = group_advantages(torch.tensor([[3.0, 1.0, 2.0]]), eps=1e-6)
    assert adv.tolist()[0] == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0], rel=1e-6)


def test_zero_variance_group_gives_zero_advantage():
    adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]))
    assert adv[0].abs().sum() == 0
    assert adv[1].abs().sum() == 0
    assert adv[2].abs().sum() > 0


def test_dr_grpo_drops_std_division():
    adv = group_advantages(torch.tensor([[2.0, 0.0]]), scale_by_std=False)
    assert adv.tolist()[0] == pytest.approx([1.0, -1.0])


def test_invalid_samples_are_left_out_of_mean_and_std():
    rewards = torch.tensor([[1.0, 0.0, 123.0]])  # the 123 is a failed reward: must not count
    valid = torch.tensor([[True, True, False]])
    adv = group_advantages(rewards, valid, eps=0.0)
    # mean 0.5, sample std of (1, 0) = sqrt(0.5)
    expected = 0.5 / math.sqrt(0.5)
    assert adv.tolist()[0] == pytest.approx([expected, -expected, 0.0], rel=1e-6)


def test_group_with_one_valid_sample_has_no_signal():
    adv = group_advantages(torch.tensor([[1.0, 0.0]]), torch.tensor([[True, False]]))
    assert adv.abs().sum() == 0
