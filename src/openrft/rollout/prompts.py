"""Chat messages -> prompt token ids through the model's chat template."""

from __future__ import annotations

from typing import Any

REASONING_ON = ("low", "medium", "high")


def render_prompt(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    reasoning_effort: str | None = None,
) -> list[int]:
    """Token ids of the prompt, ending where the assistant's answer begins.

    The reasoning setting reaches templates that support it: ``enable_thinking`` (Qwen3-style) and
    ``reasoning_effort`` (gpt-oss-style); templates that do not use them ignore them. A tokenizer
    without a chat template gets the message contents joined by newlines.
    """
    if getattr(tokenizer, "chat_template", None):
        text = chat_text(tokenizer, messages, tools, reasoning_effort, add_generation_prompt=True)
    else:
        text = "\n".join(m["content"] for m in messages) + "\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_text(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reasoning_effort: str | None,
    add_generation_prompt: bool,
) -> str:
    """The chat template's text of a conversation (see ``render_prompt`` for the reasoning settings)."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=reasoning_effort in REASONING_ON,
        reasoning_effort=reasoning_effort or "low",
    )
