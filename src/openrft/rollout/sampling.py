"""Choosing the next token from logits: temperature, top-k, top-p; log-probs of the choice."""

from __future__ import annotations

import torch

from openrft.algo.rollout_correction import filter_logits


def scaled_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax of ``logits / temperature`` (temperature 0 is read as 1: greedy has no density)."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


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
