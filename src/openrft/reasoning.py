"""Reasoning a model wrote before its answer (``<think>...</think>``), taken out of the text a grader or judge
reads; shared by rewards (judges' replies) and tools (an episode's final answer)."""

from __future__ import annotations


def without_thinking(text: str) -> str:
    """``text`` without its ``<think>...</think>`` spans, in linear time (``re.sub`` of ``<think>.*?</think>``
    rescans to the end from every unclosed ``<think>``: quadratic)."""
    kept, at = [], 0
    while (start := text.find("<think>", at)) >= 0 and (end := text.find("</think>", start + 7)) >= 0:
        kept.append(text[at:start])
        at = end + len("</think>")
    kept.append(text[at:])
    return "".join(kept)
