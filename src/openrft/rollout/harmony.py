"""Tool calls in OpenAI's harmony format (gpt-oss): a turn is a run of messages, each a header, ``<|message|>``
and a body, ended by ``<|end|>``, ``<|call|>`` or ``<|return|>``; the next one starts ``<|start|>assistant``.

The header names the channel (``<|channel|>analysis``, ``commentary`` or ``final``) and, for a call, the
recipient ``to=functions.NAME`` (before or after the channel) with the body's type (``<|constrain|>json`` or
``json``); the body of a call is its JSON arguments. This shape is the one gpt-oss's published chat template
renders and its model card describes (github.com/openai/harmony).
"""

from __future__ import annotations

import json
import re
from typing import Any

CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
RECIPIENT = re.compile(r"to=([^\s<]+)")
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = ("<|channel|>", "to=functions.")


def is_harmony(text: str) -> bool:
    return any(marker in text for marker in MARKERS)


def parse_harmony(text: str) -> tuple[str, list[tuple[str, Any]], list[str]]:
    """``(content, [(name, arguments)], malformed)``: the content is the ``final`` channel's text when the
    turn has one, else its analysis and commentary text (what a template renders as the call's analysis)."""
    finals: list[str] = []
    notes: list[str] = []
    calls: list[tuple[str, Any]] = []
    malformed: list[str] = []
    for message in text.split("<|start|>"):
        header, sep, body = message.partition("<|message|>")
        if not sep:
            continue
        for terminator in TERMINATORS:
            body = body.split(terminator)[0]
        channel = CHANNEL.search(header)
        recipient = RECIPIENT.search(header)
        if recipient and recipient.group(1).startswith("functions."):
            name = recipient.group(1)[len("functions.") :]
            try:
                arguments = json.loads(body)
            except (ValueError, RecursionError):  # deeply nested brackets raise RecursionError
                arguments = None
            if name and isinstance(arguments, dict):
                calls.append((name, arguments))
            else:
                malformed.append(message)
        elif channel and channel.group(1) == "final":
            finals.append(body)
        else:
            notes.append(body)
    content = "\n".join(finals) if finals else "\n".join(n for n in notes if n)
    return content.strip(), calls, malformed
