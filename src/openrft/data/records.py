"""Dataset records as the engine sees them, whatever format the file was in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """One prompt of a dataset.

    ``messages`` is the prompt in the OpenAI chat format with roles normalised (developer -> system).
    ``fields`` holds every other field of the line (``reference_answer``, ``task_id``, Vertex
    ``references``...): rewards see them as metadata / ``item`` / ``example``.
    """

    id: str
    messages: list[dict[str, Any]]
    fields: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    line: int | None = None

    def row(self) -> dict[str, Any]:
        """The dataset line as a dict: every field, ``messages`` and ``tools`` included (OpenAI graders'
        ``item``, what an environment is reset with)."""
        row = dict(self.fields)
        row.setdefault("messages", self.messages)
        if self.tools is not None:
            row.setdefault("tools", self.tools)
        return row

    @property
    def reference_answer(self) -> Any:
        """``reference_answer`` (messages format), else Vertex's ``references`` map."""
        if "reference_answer" in self.fields:
            return self.fields["reference_answer"]
        return self.fields.get("references")


def without_thinking(text: str) -> str:
    """A message's ``text`` (a model's answer, a judge's reply) without its ``<think>...</think>`` spans, in linear
    time (``re.sub`` of ``<think>.*?</think>`` rescans to the end from every unclosed ``<think>``: quadratic).
    Shared by rewards (judges' replies) and tools (an episode's final answer)."""
    kept, at = [], 0
    while (start := text.find("<think>", at)) >= 0 and (end := text.find("</think>", start + 7)) >= 0:
        kept.append(text[at:start])
        at = end + len("</think>")
    kept.append(text[at:])
    return "".join(kept)
