"""Choosing the next token from logits: temperature, top-k, top-p; log-probs of the choice."""

from __future__ import annotations

import math

import torch


def scaled_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax of ``logits / temperature`` (temperature 0 is read as 1: greedy has no density)."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def filter_logits(logp: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0) -> torch.Tensor:
    """Mask (to -inf) every token below ``min_p`` times the most likely token's probability (``min_p`` > 0),
    outside the top-k and outside the top-p nucleus. vLLM's order: min-p on the whole distribution, then
    top-k, then top-p over what is left (renormalised)."""
    if min_p > 0.0:
        top = logp.max(dim=-1, keepdim=True).values
        logp = logp.masked_fill(logp < top + math.log(min_p), float("-inf"))
    if top_k > 0 and top_k < logp.shape[-1]:
        kth = torch.topk(logp, top_k, dim=-1).values[..., -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, descending=True, dim=-1)
        cumulative = sorted_logp.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logp.softmax(-1) >= top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    min_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens ``[batch]`` and their log-probs under the temperature-scaled distribution."""
    logp = scaled_log_probs(logits, temperature)
    if temperature == 0:
        tokens = logp.argmax(dim=-1)
    else:
        filtered = filter_logits(logp, top_k, top_p, min_p)
        tokens = torch.multinomial(filtered.softmax(-1), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
