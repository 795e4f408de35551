"""What the tool examples' model builders share (scripts/build_tool_model.py, scripts/build_guess_model.py):
episodes as token ids with labels only on the model's own turns, padded batches, the pre-training loop."""

from __future__ import annotations

from collections.abc import Callable

import torch

from openrft.tools.continuation import continuation_ids

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
TOOLS_LINE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\nTools: ' }}"
    "{%- for tool in tools %}"
    "{{- tool.function.name + '(' + (tool.function.parameters.properties | list | join(',')) + ')' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
)


def chat_template(calls: str, tool_message: str | None = None) -> str:
    """The demo model's ChatML with a system line listing the rows' tools (``name(arguments)``): ``calls`` writes
    an assistant message's ``tool_calls``, ``tool_message`` a tool message (None: as any other role)."""
    tool_branch = "" if tool_message is None else "{%- elif message.role == 'tool' %}" + tool_message
    return (
        TOOLS_LINE + "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
        + calls
        + "{{- '<|im_end|>\\n' }}"
        + tool_branch
        + "{%- else %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


class EpisodeTokens:
    """One episode's token ids and labels: -100 where the model did not write (prompt, tool results)."""

    def __init__(self, tokenizer, prompt: list[int]):
        self.tokenizer = tokenizer
        self.ids, self.labels = list(prompt), [-100] * len(prompt)

    def model_turn(self, text: str) -> None:
        turn = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        self.ids.extend(turn)
        self.labels.extend(turn)

    def tool_turn(self, before: list[dict], after: list[dict], tools: list[dict]) -> None:
        """The chat template's tokens for what ``after`` adds to ``before`` (the tool messages), unlabelled."""
        tokens = continuation_ids(self.tokenizer, before, after, tools, None, self.tokenizer.eos_token_id)
        self.ids.extend(tokens)
        self.labels.extend([-100] * len(tokens))


def padded(tokenizer, seqs: list[tuple[list[int], list[int]]]) -> Batch:
    """Right-padded ids, labels and attention mask of ``(ids, labels)`` sequences."""
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, lab) in enumerate(seqs):
        ids[i, : len(s)], labels[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), torch.tensor(lab), 1
    return ids, labels, mask


def pretrain(
    model,
    steps: int,
    next_batch: Callable[[], Batch],
    report: Callable[[int, float], None] | None = None,
    decay: bool = False,
) -> None:
    """AdamW at 2e-3 with 100 warm-up steps, then constant (or, with ``decay``, down linearly to 0 at the last
    step), gradients clipped at 1; ``report(step, loss)`` every 100 steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    def rate(s: int) -> float:
        return min(1.0, (s + 1) / 100, (steps - s) / max(1, steps - 100) if decay else 1.0)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    model.train()
    for step in range(1, steps + 1):
        ids, labels, mask = next_batch()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if report is not None and step % 100 == 0:
            report(step, loss.item())
