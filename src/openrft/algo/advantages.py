"""Group-relative advantages (GRPO; Dr. GRPO without the std division)."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, valid: torch.Tensor | None = None, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` for rewards shaped ``[groups, samples]``.

    Only ``valid`` samples (rewards that did not fail) enter a group's mean and std; invalid samples
    get advantage 0. A group with zero variance, or fewer than two valid samples, gives zero
    advantage. The std is the sample std (Bessel-corrected), as in TRL and verl.
    """
    rewards = rewards.to(torch.float64)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.to(torch.bool)
    weight = valid.to(rewards.dtype)
    count = weight.sum(dim=1, keepdim=True)
    safe_count = count.clamp(min=1)
    mean = (rewards * weight).sum(dim=1, keepdim=True) / safe_count
    centred = (rewards - mean) * weight
    variance = centred.pow(2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
    std = variance.sqrt()
    advantages = centred / (std + eps) if scale_by_std else centred
    degenerate = (count < 2) | (std <= 1e-12)
    return torch.where(degenerate | ~valid, torch.zeros_like(advantages), advantages).to(torch.float32)
