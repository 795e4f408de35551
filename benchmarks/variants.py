"""Benchmark-only learners, each the engine's learner with one optimisation taken out.

They exist to measure what each optimisation buys (``benchmarks.optimizations``); the engine has
none of these code paths.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import torch

from openrft import prefix_attention
from openrft.learner import Learner
from openrft.learner.batch import MicroBatch, TrainSample
from openrft.learner.learner import token_logp
from openrft.models import load_causal_lm
from openrft.rollout.kv import cache_keyword


def full_sequence_logits(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """The logits of ``response_logits`` from whole sequences: every sample's prompt computed again."""
    index = mb.prompt_index
    ids = torch.cat([mb.prompt_ids.index_select(0, index), mb.response_ids], dim=-1)
    mask = torch.cat([mb.prompt_mask.index_select(0, index), mb.response_mask.long()], dim=-1)
    positions = torch.cat([mb.prompt_positions.index_select(0, index), mb.response_positions], dim=-1)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=mb.response_width + 1,
    )
    logits = out.logits[:, :-1, :].float()
    return logits / temperature if temperature > 0 else logits


def full_head_logits(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """``response_logits`` with the language-model head run over every position, prompts included."""
    from transformers import DynamicCache

    kwarg, cache = cache_keyword(model), DynamicCache()
    out = model(
        input_ids=mb.prompt_ids,
        attention_mask=mb.prompt_mask,
        position_ids=mb.prompt_positions,
        use_cache=True,
        logits_to_keep=0,
        **{kwarg: cache},
    )
    logits = out.logits[:, -1:, :].index_select(0, mb.prompt_index)
    if mb.response_width > 1:
        cache.batch_select_indices(mb.prompt_index)
        mask = torch.cat([mb.prompt_mask.index_select(0, mb.prompt_index), mb.response_mask[:, :-1].long()], -1)
        rest = model(
            input_ids=mb.response_ids[:, :-1],
            attention_mask=mask,
            position_ids=mb.response_positions[:, :-1],
            use_cache=True,
            logits_to_keep=0,
            **{kwarg: cache},
        ).logits
        logits = torch.cat([logits, rest], dim=1)
    logits = logits.float()
    return logits / temperature if temperature > 0 else logits


class FullSequenceLearner(Learner):
    """No shared prefix: policy and reference run every sample's whole sequence."""

    def logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return full_sequence_logits(model, mb, self.config.temperature)


class FullHeadLearner(Learner):
    """The LM head over every position (no ``logits_to_keep``)."""

    def logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return full_head_logits(model, mb, self.config.temperature)


class SecondPassLearner(Learner):
    """The old log-probs from a separate no-grad forward, as a trainer that cannot assume on-policy does."""

    def proximal_logp(self, mb: MicroBatch, logp: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return token_logp(self.logits(self.model, mb), mb.targets)


class CopiedReferenceLearner(Learner):
    """The reference as a second model loaded from the checkpoint, not the adapter disabled on the same weights."""

    model_name: str = "openrft-demo"

    def __init__(self, policy, config):
        super().__init__(policy, config)
        dtype = next(self.model.parameters()).dtype
        self.reference = load_causal_lm(self.model_name, self.device, dtype).requires_grad_(False).eval()

    @property
    def reference_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.reference.parameters())

    @torch.no_grad()
    def _reference_logp(self, mb: MicroBatch) -> torch.Tensor:
        return token_logp(self.logits(self.reference, mb), mb.targets)


class ShuffledFixedLearner(Learner):
    """Micro-batches of a fixed number of samples from the shuffled batch (TRL's layout), not planned by tokens."""

    samples_per_micro_batch: int = 16

    def plan(self, samples: list[TrainSample]) -> list[list[int]]:
        order = list(range(len(samples)))
        random.Random(0).shuffle(order)
        k = self.samples_per_micro_batch
        return [order[i : i + k] for i in range(0, len(order), k)]


@contextlib.contextmanager
def gathered_prompt_cache() -> Iterator[None]:
    """Inside, the prompts' KV cache is copied onto every row that continues it (the learner's responses, the
    generator's samples), which then attend to their own copy through SDPA (``prefix_attention`` not taken)."""
    taken = prefix_attention.MEMORY_RATIO
    prefix_attention.MEMORY_RATIO = 0.0
    try:
        yield
    finally:
        prefix_attention.MEMORY_RATIO = taken


class GatheredPrefixLearner(Learner):
    """The learner with ``gathered_prompt_cache``."""

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        with gathered_prompt_cache():
            return super().step(samples)
