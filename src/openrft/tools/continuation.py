"""The tokens a chat template puts after a tool result, computed from the template itself.

After the model's turn (its own sampled tokens, ending with its end-of-turn token) the episode goes on with
the template's rendering of the new messages (tool results, an environment's observation) and the header
of the next assistant turn. Those tokens are found by rendering the conversation without the new messages
(``head``) and with them and the generation prompt (``full``) and taking the difference; nothing about the
template's shape is assumed. Two cases:

- ``head`` is a prefix of ``full`` (Qwen2.5, Llama 3.x, Mistral, gpt-oss): the continuation is what
  ``head`` writes after the model's end token plus ``full``'s tail.
- the template renders the model's last turn differently once something follows it (Qwen3 writes an empty
  ``<think>`` block into the last assistant turn only): the continuation starts after that turn's end token
  in ``full``, found after the point where ``head`` and ``full`` part. Earlier turns must render the same
  in both (they are already tokens of the episode); a template that changes them is refused.

The model's sampled tokens are never re-tokenized.
"""

from __future__ import annotations

from typing import Any

from openrft.errors import OpenRFTError
from openrft.rollout.prompts import chat_text


class ToolTemplateError(OpenRFTError):
    """The model's chat template cannot continue a conversation with tool results."""


def call_id(turn: int, index: int) -> str:
    """The id of call ``index`` of model turn ``turn``: 9 letters and digits (``call01000``), unique in the
    episode and deterministic. Mistral's templates require exactly 9 alphanumeric characters (they raise
    otherwise); the other families accept any string."""
    if not (0 <= turn < 100 and 0 <= index < 1000):
        raise ValueError(f"call id out of range: turn {turn}, call {index}")
    return f"call{turn:02d}{index:03d}"


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def continuation_text(head: str, full: str, end: str) -> str:
    """The text that follows the model's end-of-turn text ``end`` (``""`` when unknown) in the rendering
    ``full`` of the longer conversation, given ``head``, the rendering that ends with the model's turn."""
    if full.startswith(head):
        cut = head.rfind(end) if end else -1
        trailing = head[cut + len(end) :] if cut >= 0 else ""  # what the template writes after the end token
        return trailing + full[len(head) :]
    if not end or end not in head:
        raise ToolTemplateError(
            "the chat template renders the model's last turn differently once tool messages follow it, and the "
            f"turn's end token {end!r} does not appear in the template's rendering of it, so the point where the "
            "tool results start cannot be found"
        )
    parted = _common_prefix(head, full)
    last_end = head.rfind(end)
    if last_end + len(end) <= parted:  # the turn's end token is in the shared part: the change is after it
        return full[last_end + len(end) :]
    earlier = head.count(end, 0, last_end)  # end tokens of the turns before the model's last one
    if head.count(end, 0, parted) != earlier:
        raise ToolTemplateError(
            "the chat template renders earlier turns of the conversation differently once tool messages follow "
            "them; those turns are already tokens of the episode, so the tool results cannot be appended"
        )
    shared_end = head.rfind(end, 0, parted)
    position = full.find(end, shared_end + len(end) if shared_end >= 0 else 0)
    if position < 0:
        raise ToolTemplateError(
            f"the chat template does not end the model's turn with {end!r} once tool messages follow it"
        )
    return full[position + len(end) :]


def continuation_ids(
    tokenizer,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reasoning_effort: str | None,
    last_token: int | None,
) -> list[int]:
    """Token ids that follow the model's end-of-turn token ``last_token``: the chat template's rendering of
    what ``after`` adds to ``before`` (the tool messages) and the next assistant turn's header."""
    head = chat_text(tokenizer, before, tools, reasoning_effort, add_generation_prompt=False)
    full = chat_text(tokenizer, after, tools, reasoning_effort, add_generation_prompt=True)
    end = tokenizer.decode([last_token], skip_special_tokens=False) if last_token is not None else ""
    return tokenizer(continuation_text(head, full, end), add_special_tokens=False)["input_ids"]


PROBE_RESULTS = ("4131", "4132")


def template_problems(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    reasoning_effort: str | None,
    end_texts: list[str],
) -> list[str]:
    """Why the chat template cannot carry a tool episode, found by rendering one: the row's ``messages``,
    a call of its first tool, the result, a second call, the result (what a job's first turns do). Empty
    when the template continues both turns and shows each result to the model. ``end_texts``: the texts of
    the model's end-of-turn tokens (the one the template writes after a turn is taken as the model's)."""
    if not getattr(tokenizer, "chat_template", None):
        return ["the model's tokenizer has no chat template; multi-turn rollouts with tools need one"]
    name = tools[0]["function"]["name"]
    history = list(messages)
    for turn, result in enumerate(PROBE_RESULTS, start=1):
        call = {"id": call_id(turn, 0), "type": "function", "function": {"name": name, "arguments": {}}}
        before = [*history, {"role": "assistant", "content": "", "tool_calls": [call]}]
        after = [*before, {"role": "tool", "tool_call_id": call["id"], "name": name, "content": result}]
        try:
            prompt = chat_text(tokenizer, history, tools, reasoning_effort, add_generation_prompt=True)
            head = chat_text(tokenizer, before, tools, reasoning_effort, add_generation_prompt=False)
            full = chat_text(tokenizer, after, tools, reasoning_effort, add_generation_prompt=True)
            turn_text = head[len(prompt) :] if head.startswith(prompt) else head
            # the model's end token: the last one the template writes after the turn that it can continue from
            # (Phi-4-mini writes <|end|> and, ending the conversation, <|endoftext|>: the model stops at <|end|>)
            ends = [
                e for _, e in sorted(((turn_text.rfind(e), e) for e in end_texts if e and e in turn_text), reverse=True)
            ]
            text = None
            for end in ends or [""]:
                try:
                    text = continuation_text(head, full, end)
                    break
                except ToolTemplateError:
                    if end == (ends or [""])[-1]:
                        raise
        except ToolTemplateError as exc:
            return [f"the chat template cannot continue a tool episode at turn {turn}: {exc}"]
        except Exception as exc:  # the template raised (jinja's raise_exception, a missing field)
            return [f"the chat template fails on a tool episode at turn {turn}: {type(exc).__name__}: {exc}"]
        if result not in text:
            return [
                f"the chat template does not show a tool's result to the model (turn {turn}: the text after the "
                f"model's call, {text[:120]!r}, does not contain the result {result!r})"
            ]
        history = after
    return []
