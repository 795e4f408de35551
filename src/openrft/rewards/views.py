"""What each service's reward code sees of a sample: one place that builds those shapes.

- Nova Lambda input entry: the dataset line with ``id`` and ``messages`` (prompt + the rollout's
  messages: the assistant's answer, its ``tool_calls`` and the tool results of a multi-turn rollout);
  its other fields (``reference_answer`` ...) both at the top level and under ``metadata``.
- OpenAI: ``item`` is the dataset line (``Example.row()``: every field, ``messages`` included); ``sample`` holds
  ``output_text``, ``output_json`` (``None`` when the output is not JSON) and ``output_tools`` (the tool
  calls parsed from the output, OpenAI's shape; ``RewardSample.output_tools``).
- Vertex: the example in Vertex's dataset shape (``contents``, ``systemInstruction``,
  ``references``), built from the messages when the line was in the messages format.
"""

from __future__ import annotations

import json
from typing import Any

from openrft.data.records import Example
from openrft.rewards.types import RewardSample

VERTEX_ROLES = {"user": "user", "assistant": "model", "tool": "user"}


def nova_entry(sample: RewardSample) -> dict[str, Any]:
    """One sample of a Nova/Bedrock reward Lambda's event, as the services send it: the dataset line with a
    unique ``id`` and the answer appended to ``messages``, its other fields (``reference_answer``, ``tools``,
    ...) at the top level. ``metadata`` also holds those fields (merged with the line's own ``metadata``
    object, if any), for Lambdas that read ``sample["metadata"]["reference_answer"]``."""
    example = sample.example
    row = {k: v for k, v in example.fields.items() if k not in ("id", "messages")}
    if example.tools is not None:
        row.setdefault("tools", example.tools)
    metadata = {k: v for k, v in row.items() if k != "metadata"}
    if isinstance(row.get("metadata"), dict):
        metadata.update(row["metadata"])
    messages = [*example.messages, *sample.output_messages]
    return {"id": example.id, "messages": messages, **row, "metadata": metadata}


def output_json_or_none(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except (ValueError, RecursionError):
        return None


def openai_sample(sample: RewardSample) -> dict[str, Any]:
    text = sample.output_text
    return {"output_text": text, "output_json": output_json_or_none(text), "output_tools": sample.output_tools}


def system_text(example: Example) -> str:
    return "\n".join(m["content"] for m in example.messages if m["role"] == "system")


def prompt_text(example: Example) -> str:
    """The conversation without its system message, one turn per line (the last is usually the question)."""
    return "\n".join(m["content"] for m in example.messages if m["role"] != "system")


def vertex_example(example: Example) -> dict[str, Any]:
    fields = dict(example.fields)
    if "contents" not in fields:
        fields["contents"] = [
            {"role": VERTEX_ROLES.get(m["role"], "user"), "parts": [{"text": m["content"]}]}
            for m in example.messages
            if m["role"] != "system"
        ]
    if "systemInstruction" not in fields and system_text(example):
        fields["systemInstruction"] = {"role": "system", "parts": [{"text": system_text(example)}]}
    fields.setdefault("references", {})
    return fields


def vertex_references(example: Example) -> dict[str, Any]:
    references = example.fields.get("references")
    return references if isinstance(references, dict) else {}
