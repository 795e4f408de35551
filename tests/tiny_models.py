"""Tiny Qwen2 models for tests that need a real decoder but not the demo model's weights or tokenizer."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from openrft.learner.batch import TrainSample

TINY_QWEN2 = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
"""Two layers of width 16, four query heads sharing two key/value heads (head_dim 4): grouped-query
attention, as in the real Qwen2 models, at a size that runs in milliseconds on a CPU."""


def tiny_qwen2_config(vocab_size: int, max_position_embeddings: int, **overrides: Any) -> Qwen2Config:
    """A Qwen2Config of ``TINY_QWEN2``'s shape; ``overrides`` change any field (``tie_word_embeddings``...)."""
    return Qwen2Config(
        vocab_size=vocab_size, max_position_embeddings=max_position_embeddings, **{**TINY_QWEN2, **overrides}
    )


def tiny_qwen2(vocab_size: int, max_position_embeddings: int, **overrides: Any) -> Qwen2ForCausalLM:
    """A randomly initialised model (seed torch first for the same weights every run)."""
    return Qwen2ForCausalLM(tiny_qwen2_config(vocab_size, max_position_embeddings, **overrides))


def grouped_samples(vocab_size: int) -> list[TrainSample]:
    """Three prompts of 3, 5 and 7 tokens with three answers each, of 2 to 10 tokens (the same every run)."""
    g = torch.Generator().manual_seed(1)
    samples = []
    for p in range(3):
        prompt = torch.randint(1, vocab_size, (3 + 2 * p,), generator=g).tolist()
        for k in range(3):
            response = torch.randint(1, vocab_size, (2 + (5 * p + 3 * k) % 9,), generator=g).tolist()
            samples.append(TrainSample(prompt, response, advantage=float(k) - 1.0))
    return samples
