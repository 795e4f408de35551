"""Rollout correction: importance weights between the engine that sampled and the learner that trains.

A generation engine (vLLM, a server) and the learner never compute exactly the same probabilities
(other kernels, other precision, batch-dependent reductions), so a sample the engine drew from
``pi_engine`` is off-policy for the learner's ``pi_old`` even at the same weights. The correction
reweights each trained token's policy-gradient term by ``rho = pi_old(y) / pi_engine(y)``
(docs/algorithm.md, "Rollout correction"):

- ``tis`` (truncated importance sampling): ``w = min(rho, cap)``;
- ``mis`` (masked importance sampling): ``w = rho`` where ``1/cap <= rho <= cap``, else 0 (the token,
  or at sequence level the whole sequence, leaves the loss);
- ``token`` level: ``rho`` per token; ``sequence`` level: one ratio per sequence, the exponential of
  the **mean** of its token log-ratios (a geometric mean; a product would explode with length).

An engine log-prob that is missing or not finite (NaN) is neutral: its token gets ``rho = 1``, is left
out of the sequence mean and of the mismatch statistics, and is counted. Both sides must be the same
density: the learner's ``pi_old`` is taken on the engine's support (``support_log_probs``: the top-k /
top-p / min-p truncated, renormalised distribution when the engine reports the processed density).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

CorrectionMode = Literal["off", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]


@dataclass
class CorrectionResult:
    """Per-token weights ``[rows, tokens]`` (0 where masked) and the sums behind the mismatch metrics."""

    weights: torch.Tensor
    masked: torch.Tensor  # bool: tokens the correction took out of the loss
    tokens: float  # tokens compared (trained, engine log-prob present)
    missing: float  # trained tokens whose engine log-prob was missing or not finite
    masked_tokens: float
    truncated_tokens: float  # tokens whose weight the cap lowered (tis)
    ratio_sum: float  # sum and sum of squares of the per-token ratio rho, over the compared tokens
    ratio_sq_sum: float
    kl_sum: float  # k3 estimate of KL(engine || learner) per compared token, summed


def engine_log_ratio(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi_old - log pi_engine`` on the compared tokens (0 elsewhere) and which tokens those are:
    trained (``mask``) with a finite engine log-prob."""
    compared = mask.bool() & torch.isfinite(engine_logp)
    safe_engine = torch.where(compared, engine_logp, torch.zeros_like(engine_logp))
    log_ratio = torch.where(compared, trainer_logp - safe_engine, torch.zeros_like(trainer_logp))
    return log_ratio, compared


def sequence_log_ratio(log_ratio: torch.Tensor, compared: torch.Tensor) -> torch.Tensor:
    """Each row's mean token log-ratio over its compared tokens ``[rows]`` (0 for a row with none)."""
    count = compared.sum(-1)
    total = (log_ratio * compared).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def correction_weights(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: CorrectionMode,
    level: CorrectionLevel,
    cap: float,
) -> CorrectionResult:
    """The rollout-correction weights of a batch (module docstring); no gradient flows through them."""
    if cap <= 1:
        raise ValueError(f"the rollout-correction cap must be above 1, got {cap}")
    trainer_logp, engine_logp = trainer_logp.detach().float(), engine_logp.detach().float()
    trained = mask.bool()
    # a missing engine log-prob has log-ratio 0: weight 1 at token level, the row's weight at sequence level
    log_ratio, compared = engine_log_ratio(trainer_logp, engine_logp, trained)
    token_ratio = torch.exp(log_ratio)
    if level == "sequence":
        ratio = torch.exp(sequence_log_ratio(log_ratio, compared)).unsqueeze(-1).expand_as(token_ratio)
    else:
        ratio = token_ratio
    masked = torch.zeros_like(trained)
    truncated = torch.zeros_like(trained)
    if mode == "tis":
        weights = torch.clamp(ratio, max=cap)
        truncated = trained & (ratio > cap)
    elif mode == "mis":
        masked = trained & ((ratio > cap) | (ratio < 1.0 / cap))
        weights = torch.where(masked, torch.zeros_like(ratio), ratio)
    elif mode == "off":
        weights = torch.ones_like(ratio)
    else:
        raise ValueError(f"unknown rollout-correction mode {mode!r}: allowed are 'off', 'tis', 'mis'")
    weights = weights * trained
    compared_f = compared.double()
    lr = log_ratio.double()
    k3 = (torch.expm1(lr) - lr).clamp(min=0.0)  # rho - 1 - log rho, in float64: >= 0 even for tiny ratios
    return CorrectionResult(
        weights=weights,
        masked=masked,
        tokens=compared_f.sum().item(),
        missing=(trained & ~compared).sum().item(),
        masked_tokens=masked.sum().item(),
        truncated_tokens=truncated.sum().item(),
        ratio_sum=(token_ratio.double() * compared_f).sum().item(),
        ratio_sq_sum=(token_ratio.double().square() * compared_f).sum().item(),
        kl_sum=(k3 * compared_f).sum().item(),
    )


def correction_metrics(sums: dict[str, float], trained_tokens: float) -> dict[str, float]:
    """The engine-learner mismatch of a step from summed ``CorrectionResult`` fields (keys as in
    ``CORRECTION_SUM_KEYS``): KL, ratio mean and spread over the compared tokens, fractions masked /
    truncated over the trained tokens, and the count of missing engine log-probs."""
    tokens = sums["rc_tokens"]
    metrics = {"rollout_correction/missing_logprobs": sums["rc_missing"]}
    if tokens > 0:
        mean = sums["rc_ratio"] / tokens
        variance = max(sums["rc_ratio_sq"] / tokens - mean * mean, 0.0)
        metrics.update(
            {
                "rollout_correction/kl": sums["rc_kl"] / tokens,
                "rollout_correction/ratio_mean": mean,
                "rollout_correction/ratio_std": variance**0.5,
            }
        )
    if trained_tokens > 0:
        metrics["rollout_correction/masked_fraction"] = sums["rc_masked"] / trained_tokens
        metrics["rollout_correction/truncated_fraction"] = sums["rc_truncated"] / trained_tokens
    return metrics


CORRECTION_SUM_KEYS = ("rc_tokens", "rc_missing", "rc_masked", "rc_truncated", "rc_ratio", "rc_ratio_sq", "rc_kl")


def correction_sums(result: CorrectionResult) -> dict[str, float]:
    return {
        "rc_tokens": result.tokens,
        "rc_missing": result.missing,
        "rc_masked": result.masked_tokens,
        "rc_truncated": result.truncated_tokens,
        "rc_ratio": result.ratio_sum,
        "rc_ratio_sq": result.ratio_sq_sum,
        "rc_kl": result.kl_sum,
    }


def support_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0
) -> torch.Tensor:
    """Log-probs of ``targets`` under the truncated, renormalised distribution a sampler with top-k /
    top-p / min-p draws from (``logits`` already temperature-scaled): ``-inf`` for a target outside it."""
    from openrft.rollout.sampling import filter_logits

    logp = torch.log_softmax(logits.float(), dim=-1)
    kept = filter_logits(logp, top_k, top_p, min_p)
    return kept.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(kept, dim=-1)


def truncates(top_k: int, top_p: float, min_p: float = 0.0) -> bool:
    """Whether these sampling parameters sample from a truncated distribution."""
    return top_k > 0 or top_p < 1.0 or min_p > 0.0
