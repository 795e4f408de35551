"""Model FLOPs of a decoder-only transformer (Qwen2/Llama shape): forward, LoRA training, shared prefixes.

Conventions (those of MFU accounting): a multiply-add is 2 FLOPs; only matmuls count (the linear
layers, the two attention matmuls and the LM head; norms, activations, rotary and softmax are
left out); attention counts the causal pairs actually needed (a query attends to itself and
the keys before it), never padding. The backward pass costs one forward for the input gradients
of every matmul, plus one more for the weight gradients of trainable weights (LoRA A and B) and
for the second operand of the attention matmuls (both Q and K, both P and V, are activations).
"""

from __future__ import annotations

from dataclasses import dataclass

from openrft.learner.batch import TrainSample


@dataclass(frozen=True)
class DecoderShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> DecoderShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            heads,
            getattr(config, "num_key_value_heads", None) or heads,
            head_dim,
            config.vocab_size,
        )

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of the linear layers of one decoder layer: q, k, v, o, gate, up, down."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def linear_flops_per_token(self) -> int:
        return 2 * self.layers * sum(a * b for a, b in self.linears())

    def lora_flops_per_token(self, rank: int) -> int:
        """x -> A (in x r) -> B (r x out) on every linear of every layer ("all-linear" leaves the LM head out)."""
        return 2 * self.layers * sum(rank * (a + b) for a, b in self.linears()) if rank else 0

    def attention_flops(self, pairs: int) -> int:
        """QK^T and PV over ``pairs`` (query, key) pairs, every head, every layer."""
        return 4 * self.layers * self.heads * self.head_dim * pairs

    def head_flops(self, positions: int) -> int:
        return 2 * self.hidden * self.vocab * positions


@dataclass
class PassCount:
    """What one forward pass processes: tokens through the layers, attention pairs, LM-head positions."""

    tokens: int = 0
    pairs: int = 0
    head_positions: int = 0

    def __iadd__(self, other: PassCount) -> PassCount:
        self.tokens += other.tokens
        self.pairs += other.pairs
        self.head_positions += other.head_positions
        return self


def causal_pairs(length: int, context: int = 0) -> int:
    """(query, key) pairs of ``length`` new tokens after ``context`` cached ones, each seeing itself and all before."""
    return length * context + length * (length + 1) // 2


def shared_prefix_count(prompt_lengths: list[int], response_lengths: list[list[int]]) -> PassCount:
    """The learner's pass over groups: each prompt once (LM head on its last position), then each response
    but its last token on top of the prompt's cache (LM head on every one of them)."""
    count = PassCount()
    for p, responses in zip(prompt_lengths, response_lengths):
        count += PassCount(p, causal_pairs(p), 1)
        for r in responses:
            count += PassCount(r - 1, causal_pairs(r - 1, p), r - 1)
    return count


def full_sequence_count(prompt_lengths: list[int], response_lengths: list[list[int]]) -> PassCount:
    """The same batch with every sample's prompt recomputed (LM head on the response positions only)."""
    count = PassCount()
    for p, responses in zip(prompt_lengths, response_lengths):
        for r in responses:
            count += PassCount(p + r - 1, causal_pairs(p + r - 1), r)
    return count


def groups_of(samples: list[TrainSample]) -> tuple[list[int], list[list[int]]]:
    """Prompt lengths and their responses' lengths, one entry per distinct prompt."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for s in samples:
        groups.setdefault(tuple(s.prompt_ids), []).append(len(s.response_ids))
    return [len(p) for p in groups], list(groups.values())


def forward_flops(shape: DecoderShape, count: PassCount, lora_rank: int = 0) -> int:
    return (
        count.tokens * (shape.linear_flops_per_token() + shape.lora_flops_per_token(lora_rank))
        + shape.attention_flops(count.pairs)
        + shape.head_flops(count.head_positions)
    )


def lora_training_flops(shape: DecoderShape, count: PassCount, lora_rank: int, full_rank: bool = False) -> int:
    """Forward and backward of a LoRA policy pass (base weights frozen: input gradients only); ``full_rank``: the
    layers' linear weights trained too (their weight gradients: one more pass of their FLOPs)."""
    forward = forward_flops(shape, count, lora_rank)
    backward = (
        count.tokens * (shape.linear_flops_per_token() + 2 * shape.lora_flops_per_token(lora_rank))
        + 2 * shape.attention_flops(count.pairs)
        + shape.head_flops(count.head_positions)
    )
    if full_rank:
        backward += count.tokens * shape.linear_flops_per_token()
    return forward + backward


def learner_step_flops(
    shape: DecoderShape,
    samples: list[TrainSample],
    lora_rank: int,
    reference: bool,
    shared_prefix: bool = True,
    full_rank: bool = False,
) -> int:
    """Model FLOPs of one learner step: the policy's forward and backward, and the reference forward
    (the base model: the adapter disabled) when the KL term is on."""
    prompts, responses = groups_of(samples)
    count = (shared_prefix_count if shared_prefix else full_sequence_count)(prompts, responses)
    flops = lora_training_flops(shape, count, lora_rank, full_rank)
    if reference:
        flops += forward_flops(shape, count)
    return flops


def generation_flops(
    shape: DecoderShape, prompt_lengths: list[int], response_lengths: list[list[int]], lora_rank: int
) -> int:
    """Model FLOPs of sampling ``response_lengths`` after each prompt: the prompt's prefill once (its last position
    gives the first token), then each response's tokens but the last fed back one at a time on the prompt's cache
    (the same passes as the learner's shared-prefix count, forward only, with the adapter)."""
    return forward_flops(shape, shared_prefix_count(prompt_lengths, response_lengths), lora_rank)
