"""Training samples and their packing into shared-prefix micro-batches sized by token count.

The ``n`` samples of a GRPO group share their prompt. A micro-batch holds each distinct prompt
once and every response as a row that continues its prompt's KV cache, so a forward/backward
pass costs ``prompts * prompt_width + rows * response_width`` padded tokens instead of
``rows * (prompt_width + response_width)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openrft.rollout.kv import left_pad


@dataclass
class TrainSample:
    """One completion to learn from.

    ``behaviour_logp``: the log-probs recorded at generation, set for stale samples (policy age > 0) only;
    their ratio is taken against it. ``old_logp``: set by the learner on a fresh sample of a later
    mini-batch, the log-probs of the policy before the step's first update (``Learner.step``).

    ``loss_mask`` (one 0/1 per response token, None = all 1): which response tokens are trained on. A
    multi-turn rollout's response holds tool results and chat-template tokens the model did not sample:
    they are context (attended to) but carry no loss, no entropy and no token count.

    ``engine_logp``: the generation engine's log-probs of a fresh sample, for the rollout correction
    (None: no correction; NaN entries: missing, neutral). ``engine_truncated``: the engine's log-probs
    (``engine_logp`` or ``behaviour_logp``) are of the top-k / top-p / min-p truncated distribution.
    ``old_support_logp``: like ``old_logp``, on that truncated support.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    behaviour_logp: list[float] | None = None
    loss_mask: list[int] | None = None
    old_logp: list[float] | None = None
    engine_logp: list[float] | None = None
    engine_truncated: bool = False
    old_support_logp: list[float] | None = None

    @property
    def anchor_logp(self) -> list[float] | None:
        """The fixed log-probs the ratio is taken against, if any (else the current forward's own)."""
        return self.behaviour_logp if self.behaviour_logp is not None else self.old_logp

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trained_tokens(self) -> int:
        """Response tokens that carry loss (all of them unless ``loss_mask`` says otherwise)."""
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)


@dataclass
class MicroBatch:
    """Prompts left-padded (each ends at the last column of ``prompt_ids``); responses right-padded,
    row ``i`` continuing prompt ``prompt_index[i]`` at position ``len(prompt)``."""

    prompt_ids: torch.Tensor  # [prompts, prompt_width]
    prompt_mask: torch.Tensor  # [prompts, prompt_width]
    prompt_positions: torch.Tensor  # [prompts, prompt_width]
    prompt_index: torch.Tensor  # [rows]: the prompt each response continues
    response_ids: torch.Tensor  # [rows, response_width]: the tokens the policy is scored on
    response_mask: torch.Tensor  # [rows, response_width]: 1 on response tokens (attention)
    response_positions: torch.Tensor  # [rows, response_width]
    advantages: torch.Tensor  # [rows]
    old_logp: torch.Tensor | None  # [rows, response_width]: each row's anchor_logp (0 on rows without)
    anchored: torch.Tensor | None  # [rows] bool: rows with an anchor_logp
    stale: torch.Tensor | None  # [rows] bool: rows with behaviour log-probs (policy age > 0)
    loss_mask: torch.Tensor | None = None  # [rows, response_width]: 1 on trained tokens; None = response_mask
    engine_logp: torch.Tensor | None = None  # [rows, response_width]: engine log-probs (NaN: missing / no row)
    engine_rows: torch.Tensor | None = None  # [rows] bool: rows with engine_logp
    engine_truncated: torch.Tensor | None = None  # [rows] bool: rows whose engine log-probs are truncated
    old_support_logp: torch.Tensor | None = None  # [rows, response_width]: old_logp on the truncated support

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.response_mask

    @property
    def targets(self) -> torch.Tensor:
        return self.response_ids

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[1]

    @property
    def padded_tokens(self) -> int:
        return self.prompt_ids.numel() + self.response_ids.numel()


def padded_cost(prompt_lengths: list[int], response_lengths: list[int]) -> int:
    """Padded tokens of a micro-batch with these distinct prompts and these responses."""
    return len(prompt_lengths) * max(prompt_lengths) + len(response_lengths) * max(response_lengths)


def plan_micro_batches(samples: list[TrainSample], max_tokens: int) -> list[list[int]]:
    """Indices of samples grouped into micro-batches of at most ``max_tokens`` padded tokens
    (``padded_cost``), each sample's prompt counted once per micro-batch; at least one sample each.

    Groups (samples with the same prompt) are kept together when they fit and sorted by prompt and
    response length, which keeps padding small. The order inside the global batch does not change
    the gradient because the loss is a sum divided by the global token count.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, sample in enumerate(samples):
        groups.setdefault(tuple(sample.prompt_ids), []).append(index)
    units: list[list[int]] = []
    for members in groups.values():
        members.sort(key=lambda i: len(samples[i].response_ids))
        units += _split_group(samples, members, max_tokens)
    units.sort(key=lambda u: (len(samples[u[0]].prompt_ids), len(samples[u[-1]].response_ids)))

    plan: list[list[int]] = []
    current: list[int] = []
    prompt_width = response_width = prompt_count = 0
    for unit in units:
        p = len(samples[unit[0]].prompt_ids)
        r = len(samples[unit[-1]].response_ids)
        cost = (prompt_count + 1) * max(prompt_width, p) + (len(current) + len(unit)) * max(response_width, r)
        if current and cost > max_tokens:
            plan.append(current)
            current, prompt_width, response_width, prompt_count = [], 0, 0, 0
        current.extend(unit)
        prompt_width, response_width, prompt_count = max(prompt_width, p), max(response_width, r), prompt_count + 1
    if current:
        plan.append(current)
    return plan


def _split_group(samples: list[TrainSample], members: list[int], max_tokens: int) -> list[list[int]]:
    """A group too large for one micro-batch, in chunks that each carry the prompt (sorted members)."""
    prompt = len(samples[members[0]].prompt_ids)
    chunks: list[list[int]] = [[]]
    for index in members:  # ascending response length: the newest is the longest
        if chunks[-1] and prompt + (len(chunks[-1]) + 1) * len(samples[index].response_ids) > max_tokens:
            chunks.append([])
        chunks[-1].append(index)
    return chunks


def collate(samples: list[TrainSample], pad_token_id: int, device: torch.device) -> MicroBatch:
    prompt_of: dict[tuple[int, ...], int] = {}
    prompts: list[list[int]] = []
    index: list[int] = []
    for s in samples:
        key = tuple(s.prompt_ids)
        if key not in prompt_of:
            prompt_of[key] = len(prompts)
            prompts.append(s.prompt_ids)
        index.append(prompt_of[key])
    prompt_ids, prompt_mask, prompt_positions = left_pad(prompts, pad_token_id)

    # each tensor built from padded Python rows in one call: per-row writes cost ops per sample, every step
    lengths = [len(s.response_ids) for s in samples]
    width = max(lengths)
    response_ids = torch.tensor(
        [list(s.response_ids) + [pad_token_id] * (width - r) for s, r in zip(samples, lengths)], dtype=torch.long
    )
    response_mask = torch.tensor([[1.0] * r + [0.0] * (width - r) for r in lengths])
    loss_mask = torch.tensor(
        [_checked(s.loss_mask, r, "loss-mask values", 1.0) + [0.0] * (width - r) for s, r in zip(samples, lengths)],
        dtype=torch.float32,
    )
    anchored = torch.tensor([s.anchor_logp is not None for s in samples])
    stale = torch.tensor([s.behaviour_logp is not None for s in samples])
    old = None
    if bool(anchored.any()):
        old = torch.tensor(
            [_checked(s.anchor_logp, r, "old log-probs", 0.0) + [0.0] * (width - r) for s, r in zip(samples, lengths)]
        )
    engine = _row_values(samples, width, lambda s: s.engine_logp, "engine log-probs")
    old_support = _row_values(samples, width, lambda s: s.old_support_logp, "old support log-probs")
    engine_rows = torch.tensor([s.engine_logp is not None for s in samples])
    truncated = torch.tensor([s.engine_truncated for s in samples])
    prompt_index = torch.tensor(index, dtype=torch.long)
    start = prompt_mask.sum(-1)[prompt_index]  # each response begins right after its prompt
    response_positions = start.unsqueeze(-1) + torch.arange(width)
    return MicroBatch(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        prompt_positions=prompt_positions.to(device),
        prompt_index=prompt_index.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.to(device),
        response_positions=response_positions.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        old_logp=old.to(device) if old is not None else None,
        anchored=anchored.to(device) if old is not None else None,
        stale=stale.to(device) if bool(stale.any()) else None,
        loss_mask=loss_mask.to(device),
        engine_logp=engine.to(device) if engine is not None else None,
        engine_rows=engine_rows.to(device) if engine is not None else None,
        engine_truncated=truncated.to(device) if bool(truncated.any()) else None,
        old_support_logp=old_support.to(device) if old_support is not None else None,
    )


def _checked(values: list | None, tokens: int, name: str, default: float) -> list:
    """A sample's per-token ``values`` (``default`` for each token when None), refused unless one per token."""
    if values is None:
        return [default] * tokens
    if len(values) != tokens:
        raise ValueError(f"a sample has {tokens} response tokens but {len(values)} {name}")
    return list(values)


def _row_values(samples: list[TrainSample], width: int, values, name: str) -> torch.Tensor | None:
    """``[rows, width]`` of an optional per-token list of each sample (NaN where a sample has none), or None
    when no sample has one."""
    if all(values(s) is None for s in samples):
        return None
    nan = float("nan")
    rows = [
        _checked(values(s), len(s.response_ids), name, nan) + [nan] * (width - len(s.response_ids)) for s in samples
    ]
    return torch.tensor(rows, dtype=torch.float32)
