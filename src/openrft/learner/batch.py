"""Training samples and their packing into micro-batches sized by token count."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainSample:
    """One completion to learn from. ``behaviour_logp`` is set for off-policy rollouts only."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    behaviour_logp: list[float] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class MicroBatch:
    """Left-padded so that every response ends at the last column: the LM head then only runs over
    the last ``response_width + 1`` positions (``logits_to_keep``)."""

    input_ids: torch.Tensor  # [batch, width]
    attention_mask: torch.Tensor  # [batch, width]
    position_ids: torch.Tensor  # [batch, width]
    targets: torch.Tensor  # [batch, response_width]: the tokens predicted at the kept positions
    response_mask: torch.Tensor  # [batch, response_width]: 1 on response tokens
    advantages: torch.Tensor  # [batch]
    behaviour_logp: torch.Tensor | None  # [batch, response_width]
    response_width: int


def plan_micro_batches(samples: list[TrainSample], max_tokens: int) -> list[list[int]]:
    """Indices of samples grouped so that ``count * longest <= max_tokens`` (at least one sample each).

    Sorting by length keeps padding small; the order inside the global batch does not change the
    gradient because the loss is a sum divided by the global token count.
    """
    order = sorted(range(len(samples)), key=lambda i: samples[i].length)
    groups: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = samples[index].length  # sorted ascending: the newest is the longest
        if current and (len(current) + 1) * longest > max_tokens:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def collate(samples: list[TrainSample], pad_token_id: int, device: torch.device) -> MicroBatch:
    width = max(s.length for s in samples)
    response_width = max(len(s.response_ids) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, response_width), dtype=torch.float32)
    behaviour = torch.zeros((n, response_width)) if any(s.behaviour_logp is not None for s in samples) else None
    for i, s in enumerate(samples):
        sequence = s.prompt_ids + s.response_ids
        input_ids[i, width - len(sequence) :] = torch.tensor(sequence)
        attention_mask[i, width - len(sequence) :] = 1
        r = len(s.response_ids)
        response_mask[i, response_width - r :] = 1
        if behaviour is not None and s.behaviour_logp is not None:
            behaviour[i, response_width - r :] = torch.tensor(s.behaviour_logp)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        targets=input_ids[:, width - response_width :].to(device),
        response_mask=response_mask.to(device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        behaviour_logp=behaviour.to(device) if behaviour is not None else None,
        response_width=response_width,
    )
