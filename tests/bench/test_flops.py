"""The FLOP counter against counts done by hand for a tiny decoder, and against torch's own counter."""

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2ForCausalLM

from openrft.learner.batch import TrainSample
from openrft.learner.flops import (
    DecoderShape,
    PassCount,
    causal_pairs,
    forward_flops,
    full_sequence_count,
    learner_step_flops,
    lora_training_flops,
    shared_prefix_count,
)
from tests.tiny_models import tiny_qwen2_config

# hidden 8, MLP 16, 2 layers, 2 heads of 4, 1 KV head, vocab 10
TINY = DecoderShape(hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)


def test_per_token_counts_by_hand():
    # q 8x8, k 8x4, v 8x4, o 8x8, gate 8x16, up 8x16, down 16x8: 64+32+32+64+128+128+128 = 576 MACs a layer
    assert TINY.linear_flops_per_token() == 2 * 2 * 576
    # rank 2: 2 * ((8+8) + (8+4) + (8+4) + (8+8) + (8+16) + (8+16) + (16+8)) = 256 MACs a layer
    assert TINY.lora_flops_per_token(2) == 2 * 2 * 256
    assert TINY.attention_flops(1) == 4 * 2 * 2 * 4  # QK^T and PV, 2 heads of 4, 2 layers
    assert TINY.head_flops(1) == 2 * 8 * 10


def test_causal_pairs():
    assert causal_pairs(3) == 6  # 1 + 2 + 3
    assert causal_pairs(1, context=3) == 4  # one new token sees 3 cached ones and itself
    assert causal_pairs(2, context=3) == 4 + 5


def test_shared_prefix_and_full_sequence_counts():
    # one prompt of 3 tokens, responses of 2 and 1 tokens
    shared = shared_prefix_count([3], [[2, 1]])
    # prompt: 3 tokens, 6 pairs, LM head on its last position; response of 2: its first token runs on the cache
    # (1 token, 3 + 1 pairs, head); response of 1: nothing more (the prompt's last logits predict it)
    assert (shared.tokens, shared.pairs, shared.head_positions) == (4, 10, 2)
    full = full_sequence_count([3], [[2, 1]])
    # each sample on its own: 4 tokens (10 pairs, 2 head positions) and 3 tokens (6 pairs, 1 head position)
    assert (full.tokens, full.pairs, full.head_positions) == (7, 16, 3)


def test_learner_step_flops_by_hand():
    count = PassCount(tokens=4, pairs=10, head_positions=2)
    assert forward_flops(TINY, count) == 4 * 2304 + 64 * 10 + 160 * 2 == 10176
    assert forward_flops(TINY, count, lora_rank=2) == 10176 + 4 * 1024 == 14272
    # backward: input gradients of every matmul (one forward), LoRA weight gradients (one more LoRA forward),
    # both attention operands (two attention forwards), the head's input gradient
    backward = 4 * (2304 + 2 * 1024) + 2 * 640 + 320
    assert lora_training_flops(TINY, count, 2) == 14272 + backward == 33280
    samples = [TrainSample([1, 2, 3], [4, 5], 1.0), TrainSample([1, 2, 3], [6], -1.0)]
    assert learner_step_flops(TINY, samples, 2, reference=True) == 33280 + 10176
    assert learner_step_flops(TINY, samples, 2, reference=False) == 33280


def test_linear_and_head_flops_match_torch_flop_counter():
    config = tiny_qwen2_config(40, 64, intermediate_size=24, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    shape = DecoderShape.from_config(config)
    assert (shape.head_dim, shape.kv_heads) == (4, 2)
    tokens = 5
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.arange(1, tokens + 1).unsqueeze(0), logits_to_keep=1)
    counts = counter.get_flop_counts()["Global"]
    aten = torch.ops.aten
    matmul = sum(v for op, v in counts.items() if op in (aten.mm, aten.addmm))
    assert matmul == tokens * shape.linear_flops_per_token() + shape.head_flops(1)
