"""One pass over a micro-batch's prompts and responses together, for the sharded learner.

The shared-prefix forward (``logprobs.shared_prefix_forward``) runs the prompts, then the responses on the
prompts' KV cache: two passes through every decoder block, and two backward calls. A sharded learner gathers
a block's parameters for each pass and each backward call, so on CPU the two passes cost four all-gathers,
their copies and their fresh pages per block and step (benchmarks/results/sharding.md). Here each prompt and
its responses are laid out in one row (the prompt, then each response after it) with an attention mask that
lets a response see its prompt and its own earlier tokens only, and position ids that start every response
where its prompt ends: the same attention as the shared-prefix passes, in one forward and one backward.

The mask is ``[prompts, 1, L, L]`` for a row of ``L`` tokens, so it is used only while it stays small
(``fits``); the ranks of a sharded learner agree on the choice pass by pass, since their collectives must
match (``packing``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from openrft.attention import ATTENTION
from openrft.learner.batch import MicroBatch
from openrft.rollout.kv import forward_outputs

MAX_MASK_BYTES = 32 * 2**20
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", ATTENTION)  # the ones that take an arbitrary additive 4D mask

Decision = Callable[[torch.nn.Module, MicroBatch], bool]
_decide: ContextVar[Decision | None] = ContextVar("packing", default=None)


@contextmanager
def packing(decide: Decision) -> Iterator[None]:
    """Inside, ``shared_prefix_forward`` runs a micro-batch packed when ``decide(model, mb)`` says so (a sharded
    learner's ``decide`` is a collective: every rank must make the same choice)."""
    token = _decide.set(decide)
    try:
        yield
    finally:
        _decide.reset(token)


def packed_requested(model: torch.nn.Module, mb: MicroBatch) -> bool:
    """Whether the pass of ``mb`` runs packed here (asks ``decide`` only when a ``packing`` block is open)."""
    decide = _decide.get()
    return decide is not None and decide(model, mb)


def width(mb: MicroBatch) -> int:
    """Tokens of one packed row: the prompt, then every response of the most sampled prompt (all but the
    last token of each, which predicts nothing)."""
    counts = torch.bincount(mb.prompt_index, minlength=mb.prompt_ids.shape[0])
    return mb.prompt_ids.shape[1] + int(counts.max()) * (mb.response_width - 1)


def fits(model: torch.nn.Module, mb: MicroBatch, max_mask_bytes: int | None = None) -> bool:
    """Whether ``model`` can run ``mb`` packed: an attention that takes a 4D mask, and a mask under budget
    (``MAX_MASK_BYTES`` unless given)."""
    max_mask_bytes = MAX_MASK_BYTES if max_mask_bytes is None else max_mask_bytes
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "_attn_implementation", None) not in ATTENTION_IMPLEMENTATIONS:
        return False
    length = width(mb)
    return mb.prompt_ids.shape[0] * length * length * mask_dtype(model).itemsize <= max_mask_bytes


def mask_dtype(model: torch.nn.Module) -> torch.dtype:
    """The additive mask's dtype: the model's floating-point parameters'."""
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def layout(mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, positions, allowed, columns)``: the packed rows ``[prompts, L]``, their position ids, which key each
    query attends to ``[prompts, L, L]``, and ``[rows, response_width]``, the column of each response row's
    inputs that predicts each of its tokens (the prompt's last column, then the response's own)."""
    prompts, prompt_width = mb.prompt_ids.shape
    rows, step = mb.response_ids.shape[0], mb.response_width - 1
    length = width(mb)
    device = mb.prompt_ids.device
    slot = torch.zeros(rows, dtype=torch.long, device=device)  # the response's place among its prompt's
    seen = [0] * prompts
    for row, prompt in enumerate(mb.prompt_index.tolist()):
        slot[row], seen[prompt] = seen[prompt], seen[prompt] + 1
    start = prompt_width + slot * step  # [rows]: where each response's inputs begin
    columns = start.unsqueeze(1) + torch.arange(step, device=device)  # [rows, step]
    where = (mb.prompt_index.unsqueeze(1).expand(-1, step), columns)

    ids = torch.zeros((prompts, length), dtype=mb.prompt_ids.dtype, device=device)  # 0 where nothing attends
    positions = torch.zeros((prompts, length), dtype=mb.prompt_positions.dtype, device=device)
    valid = torch.zeros((prompts, length), dtype=torch.bool, device=device)
    segment = torch.full((prompts, length), -1, dtype=torch.long, device=device)  # -1: the prompt
    ids[:, :prompt_width], positions[:, :prompt_width] = mb.prompt_ids, mb.prompt_positions
    valid[:, :prompt_width] = mb.prompt_mask.bool()
    ids[where] = mb.response_ids[:, :step]
    positions[where] = mb.response_positions[:, :step]
    valid[where] = mb.response_mask[:, :step].bool()
    segment[where] = slot.unsqueeze(1).expand(-1, step)

    index = torch.arange(length, device=device)
    causal = index.unsqueeze(1) >= index.unsqueeze(0)  # [query, key]
    same = (segment.unsqueeze(2) == segment.unsqueeze(1)) | (segment.unsqueeze(1) == -1)
    allowed = causal & same & valid.unsqueeze(1)
    allowed |= torch.eye(length, dtype=torch.bool, device=device)  # a pad query sees itself: no empty softmax
    last = torch.full((rows, 1), prompt_width - 1, dtype=torch.long, device=device)
    return ids, positions, allowed, torch.cat([last, columns], dim=1)


def packed_forward(model: torch.nn.Module, mb: MicroBatch, hidden: bool) -> torch.Tensor:
    """What ``shared_prefix_forward`` returns (``[rows, response_width, vocab]`` logits, or the last hidden
    states with ``hidden``), from one forward over the packed rows."""
    ids, positions, allowed, columns = layout(mb)
    dtype = mask_dtype(model)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    out = forward_outputs(
        model, hidden, input_ids=ids, attention_mask=mask.unsqueeze(1), position_ids=positions, use_cache=False
    )
    return out[mb.prompt_index.unsqueeze(1), columns]
