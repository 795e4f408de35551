"""Shared-prefix log-probs equal whole-sequence ones, values and gradients (the demo model, LoRA)."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from openrft.models import load_causal_lm, load_tokenizer
from openrft.service.tinker.prefix import group_by_prefix, logprobs, whole_logprobs


def test_grouping_keeps_prompts_apart_and_answers_together():
    template = [1, 2, 3, 4, 5, 6]
    a, b = [*template, 10, 11, 12, 13, 14, 15], [*template, 20, 21, 22, 23, 24, 25]
    seqs = [[*a, 7, 8], [*b, 9], [*a, 7, 9, 9], [*a, 8], [*b, 9, 9]]
    assert group_by_prefix(seqs) == [(len(a), [0, 2, 3]), (len(b), [1, 4])]
    assert group_by_prefix([a, a]) == [(len(a) - 1, [0, 1])]  # each member keeps a token of its own


def test_shared_prefix_logprobs_and_gradients_are_the_whole_sequences():
    torch.manual_seed(0)
    tok = load_tokenizer("openrft-demo")
    base = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)  # a live adapter: its gradient then depends on the prefix's KV
    prompts = [tok.encode(f"What is {x}? ") for x in ("12+30", "7-5", "45+45")]
    seqs = [p + tok.encode(answer) for p in prompts for answer in ("42", "2", "90 ", "1")] + [tok.encode("3+3")]
    targets = [torch.tensor([*s[1:], s[0]]) for s in seqs]
    weights = [torch.rand(len(s)) for s in seqs]
    assert sum(len(ms) > 1 for _, ms in group_by_prefix(seqs)) == 3
    params = [p for p in model.parameters() if p.requires_grad]
    grads, values = [], []
    for fn in (whole_logprobs, logprobs):
        model.zero_grad()
        lps = fn(model, seqs, targets, tok.pad_token_id)
        torch.stack([(lp * w).sum() for lp, w in zip(lps, weights)]).sum().backward()
        values.append(lps)
        grads.append(torch.cat([p.grad.flatten() for p in params]))
    for whole, shared in zip(*values):
        torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=5e-5, rtol=1e-3)
    assert grads[0].abs().max() > 1e-3
