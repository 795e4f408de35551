"""Per-position log-probs of many sequences that share prefixes, each shared prefix run once.

An RL step sends one datum per sampled answer: a group's datums repeat the prompt, which is most of each
sequence. Running every datum whole (``engine.logprobs_of``) runs each prompt once per answer; here the
datums that share a prefix are grouped, the prefix runs once (logits at each of its positions, KV cache
kept, with gradients), the cache is gathered onto the group's rows, and only each datum's own tail runs on
top of it. Every datum still gets log-probs at every position of its own ``target_tokens``, so the losses,
their gradients and ``forward``'s outputs are those of the whole sequences (to float rounding).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from openrft.rollout.kv import cache_keyword, freeze

MIN_SHARED = 4  # a shorter common prefix is not worth a pass of its own


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def group_by_prefix(sequences: list[list[int]]) -> list[tuple[int, list[int]]]:
    """``(prefix_length, members)`` per group, in first-seen order: members share their first
    ``prefix_length`` tokens, and each keeps at least one token of its own after them.

    A sequence joins the group where that saves the most tokens: the shared length, less what the shorter
    prefix adds to the tails of the members already there (so prompts that share only a chat template's
    opening stay apart, and a prompt's answers come together)."""
    groups: list[tuple[list[int], list[int]]] = []  # (prefix tokens, members)
    for i, seq in enumerate(sequences):
        best, best_gain, best_shared = None, MIN_SHARED - 1, 0
        for g, (prefix, members) in enumerate(groups):
            shared = _common(prefix, seq)
            gain = shared - len(members) * (len(prefix) - shared)
            if gain > best_gain:
                best, best_gain, best_shared = g, gain, shared
        if best is None:
            groups.append((list(seq), [i]))
        else:
            prefix, members = groups[best]
            groups[best] = (prefix[:best_shared], [*members, i])
    out = []
    for prefix, members in groups:
        shortest = min(len(sequences[m]) for m in members)
        out.append((min(len(prefix), shortest - 1), members))
    return out


def _logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def whole_logprobs(model, sequences: list[list[int]], targets: list[torch.Tensor], pad: int) -> list[torch.Tensor]:
    """Per sequence, log p(targets[i] | sequence[: i + 1]) at temperature 1: one right-padded batch."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    tgt = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, (seq, target) in enumerate(zip(sequences, targets)):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        tgt[row, : len(seq)] = target
    logp = _logp(model(input_ids=ids, attention_mask=mask).logits, tgt)
    return [logp[row, : len(seq)] for row, seq in enumerate(sequences)]


def shared_logprobs(
    model, sequences: list[list[int]], targets: list[torch.Tensor], groups: list[tuple[int, list[int]]], pad: int
) -> list[torch.Tensor]:
    """As ``whole_logprobs`` for sequences in ``groups`` (from ``group_by_prefix``, each of two or more)."""
    prefixes = [sequences[members[0]][:length] for length, members in groups]
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(groups), width), pad, dtype=torch.long)
    mask = torch.zeros((len(groups), width), dtype=torch.long)
    for g, prefix in enumerate(prefixes):  # left-padded: every prefix ends at the last column
        ids[g, width - len(prefix) :] = torch.tensor(prefix)
        mask[g, width - len(prefix) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwarg = cache_keyword(model)
    cache = DynamicCache()
    head = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{kwarg: cache}).logits
    rows = [(g, m) for g, (_, members) in enumerate(groups) for m in members]
    index = torch.tensor([g for g, _ in rows])
    cache.batch_select_indices(index)
    freeze(cache)
    tails = [sequences[m][groups[g][0] :] for g, m in rows]
    tail_width = max(len(t) for t in tails)
    tail_ids = torch.full((len(rows), tail_width), pad, dtype=torch.long)
    tail_mask = torch.zeros((len(rows), tail_width), dtype=torch.long)
    tail_positions = torch.zeros((len(rows), tail_width), dtype=torch.long)
    for r, ((g, _), tail) in enumerate(zip(rows, tails)):
        tail_ids[r, : len(tail)] = torch.tensor(tail)
        tail_mask[r, : len(tail)] = 1
        start = groups[g][0]
        tail_positions[r] = torch.arange(start, start + tail_width)
    full_mask = torch.cat([mask.index_select(0, index), tail_mask], dim=-1)
    rest = model(
        input_ids=tail_ids, attention_mask=full_mask, position_ids=tail_positions, use_cache=True, **{kwarg: cache}
    ).logits
    out: dict[int, torch.Tensor] = {}
    for r, (g, m) in enumerate(rows):
        length = groups[g][0]
        logits = torch.cat([head[g, width - length :], rest[r, : len(tails[r])]], dim=0)
        out[m] = _logp(logits, targets[m])
    return [out[i] for i in range(len(sequences))]


def logprobs(model, sequences: list[list[int]], targets: list[torch.Tensor], pad: int) -> list[torch.Tensor]:
    """Per sequence, log p(targets[i] | sequence[: i + 1]): shared prefixes once, the rest whole."""
    groups = group_by_prefix(sequences)
    shared = [g for g in groups if len(g[1]) > 1 and g[0] >= MIN_SHARED]
    alone = [m for g in groups if g not in shared for m in g[1]]
    out: list[torch.Tensor | None] = [None] * len(sequences)
    if shared:
        members = [m for _, ms in shared for m in ms]
        for m, lp in zip(members, _subset(model, sequences, targets, shared, pad)):
            out[m] = lp
    if alone:
        for m, lp in zip(alone, whole_logprobs(model, [sequences[m] for m in alone], [targets[m] for m in alone], pad)):
            out[m] = lp
    return out  # type: ignore[return-value]


def _subset(model, sequences, targets, groups, pad) -> list[torch.Tensor]:
    """``shared_logprobs`` of the groups' members only, in the groups' member order."""
    members = [m for _, ms in groups for m in ms]
    local = {m: i for i, m in enumerate(members)}
    renumbered = [(length, [local[m] for m in ms]) for length, ms in groups]
    return shared_logprobs(model, [sequences[m] for m in members], [targets[m] for m in members], renumbered, pad)
