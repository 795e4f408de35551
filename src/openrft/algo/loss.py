"""The policy objective as pure tensor functions (docs/algorithm.md). Tensors are ``[batch, tokens]``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openrft.algo.losses import DEFAULT_LOSS, LossBatch, grpo, per_token


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
    batch = LossBatch(logp, old_logp, advantages.unsqueeze(-1), torch.ones_like(logp))
    config = {"clip_ratio_low": clip_low, "clip_ratio_high": clip_high, "dual_clip": dual_clip or 0.0}
    return grpo(batch, config)


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
    loss_fn: str = DEFAULT_LOSS,
    loss_config: dict[str, float] | None = None,
) -> LossTerms:
    """The per-token objective summed over ``mask``: token-level aggregation (DAPO) happens in the caller,
    which divides by the number of response tokens in the whole (mini-)batch of the update.

    ``old_logp`` is the policy the ratio is taken against (docs/algorithm.md): the behaviour policy of a
    stale sample, else the policy before the step's first update. ``loss_scale`` scales the policy loss
    only (Nova: "scaling factor for the policy loss"), not the KL or entropy terms. ``token_weights``
    (detached, ``[batch, tokens]``) multiply the policy loss per token: the rollout correction
    (``algo.rollout_correction``), 0 on the tokens it masks. ``loss_fn`` names the policy loss
    (``algo.losses``): the default ``grpo`` takes ``clip_low``, ``clip_high`` and ``dual_clip``; another
    loss takes its resolved settings in ``loss_config``.
    """
    mask = mask.to(logp.dtype)
    if loss_fn == DEFAULT_LOSS:
        pg, is_clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high, dual_clip)
    else:
        batch = LossBatch(logp, old_logp, advantages.unsqueeze(-1).expand_as(logp), mask)
        pg, is_clipped = per_token(loss_fn, batch, loss_config or {})
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
