"""Tiny Qwen2 models for tests that need a real decoder but not the demo model's weights or tokenizer."""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Config, Qwen2ForCausalLM

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
