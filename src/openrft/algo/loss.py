"""The policy objective as pure tensor functions (docs/algorithm.md). Tensors are ``[batch, tokens]``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``-min(rho*A, clip(rho, 1-clip_low, 1+clip_high)*A)`` and where a clip was active.

    ``advantages`` is per sequence ``[batch]``, broadcast over tokens. ``dual_clip`` (``c`` > 1, dual-clip
    PPO, verl's ``clip_ratio_c``) also bounds the loss of a negative advantage at ``-c*A``: a ratio above
    ``c`` then counts as ``c`` and gives no gradient, so a stale token the policy now prefers cannot weigh
    without bound. A token counts as clipped when the term chosen has no gradient.
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    is_clipped = clipped < unclipped
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        is_clipped = is_clipped | dual
    return loss, is_clipped


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position, ``[batch, tokens]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


@dataclass
class LossTerms:
    """Sums over the masked tokens of one micro-batch; divide by the global token count to aggregate."""

    loss: torch.Tensor  # differentiable: loss_scale * pg + kl_coef * kl - ent_coeff * entropy, summed
    pg_loss: float
    clipped_tokens: float
    kl: float
    entropy: float
    ratio: float  # sum of rho = exp(logp - old_logp) before clipping
    tokens: float


def policy_loss_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    ent_coeff: float = 0.0,
    loss_scale: float = 1.0,
    token_weights: torch.Tensor | None = None,
) -> LossTerms:
    """The per-token objective summed over ``mask``: token-level aggregation (DAPO) happens in the caller,
    which divides by the number of response tokens in the whole (mini-)batch of the update.

    ``old_logp`` is the policy the ratio is taken against (docs/algorithm.md): the behaviour policy of a
    stale sample, else the policy before the step's first update. ``loss_scale`` scales the policy loss
    only (Nova: "scaling factor for the policy loss"), not the KL or entropy terms. ``token_weights``
    (detached, ``[batch, tokens]``) multiply the policy loss per token: the rollout correction
    (``algo.rollout_correction``), 0 on the tokens it masks.
    """
    mask = mask.to(logp.dtype)
    pg, is_clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high, dual_clip)
    if token_weights is not None:
        pg = pg * token_weights.detach()
    total = loss_scale * pg
    kl_sum = 0.0
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp)
        total = total + kl_coef * kl
        kl_sum = masked_sum(kl.detach(), mask).item()
    entropy_sum = 0.0
    if entropy is not None:
        total = total - ent_coeff * entropy
        entropy_sum = masked_sum(entropy.detach(), mask).item()
    return LossTerms(
        loss=masked_sum(total, mask),
        pg_loss=masked_sum(pg.detach(), mask).item(),
        clipped_tokens=masked_sum(is_clipped.to(mask.dtype), mask).item(),
        kl=kl_sum,
        entropy=entropy_sum,
        ratio=masked_sum(torch.exp(logp.detach() - old_logp), mask).item(),
        tokens=mask.sum().item(),
    )
