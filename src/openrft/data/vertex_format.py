"""One line of a Vertex AI tuning dataset -> an Example in the messages format (CONTRACTS.md §2).

``{"systemInstruction": {"parts": [{"text": ...}]}, "contents": [{"role": "user", "parts": [...]}],
"references": {"ground_truth_answer": "391"}}`` becomes the messages a system/user/assistant chat
holds (Vertex's ``model`` role is ``assistant``; the parts of a turn are joined), so that the same
examples train identically in either format. ``references`` stays in ``fields`` and is the example's
reference answer. Problems name Vertex's own field paths.
"""

from __future__ import annotations

import json
from typing import Any

from openrft.data.records import Example

VERTEX_KEYS = ("contents", "systemInstruction", "system_instruction")
"""``system_instruction`` is the proto field name, which proto3 JSON parsers (Vertex's) accept as well."""
ROLES = {"user": "user", "model": "assistant"}


def is_vertex_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "messages" not in obj and any(key in obj for key in VERTEX_KEYS)


def _parts_text(parts: Any, where: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The text of a turn's parts, joined; only text parts are supported."""
    if not isinstance(parts, list) or not parts:
        return None, [(f"{where}.parts", "must be a non-empty list of {text} parts")]
    texts, problems = [], []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            kind = ", ".join(part) if isinstance(part, dict) else type(part).__name__
            problems.append(
                (f"{where}.parts[{i}]", f"must be a text part {{text: ...}} (got {kind}); OpenRFT trains on text only")
            )
            continue
        texts.append(part["text"])
    return ("".join(texts) if not problems else None), problems


def _system(value: Any) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    if not isinstance(value, dict):
        return None, [("systemInstruction", "must be an object {parts: [{text: ...}]}")]
    text, problems = _parts_text(value.get("parts"), "systemInstruction")
    return ({"role": "system", "content": text} if text is not None else None), problems


def _contents(value: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    if not isinstance(value, list) or not value:
        return [], [("contents", "must be a non-empty list of {role, parts} turns")]
    messages, problems = [], []
    for i, turn in enumerate(value):
        where = f"contents[{i}]"
        if not isinstance(turn, dict):
            problems.append((where, "must be an object with role and parts"))
            continue
        role = turn.get("role")
        if role not in ROLES:
            problems.append((f"{where}.role", f"{role!r} is not one of user, model"))
            continue
        text, part_problems = _parts_text(turn.get("parts"), where)
        problems += part_problems
        if text is not None:
            messages.append({"role": ROLES[role], "content": text})
    if not problems and not any(m["role"] == "user" for m in messages):
        problems.append(("contents", "needs at least one user turn"))
    return messages, problems


def _references(value: Any, required: bool) -> list[tuple[str, str]]:
    if value is None:
        return [("references", "is required by this job's reward")] if required else []
    if not isinstance(value, dict) or not value:
        return [("references", "must be a non-empty object of string values")]
    return [(f"references.{key}", "must be a string") for key, item in value.items() if not isinstance(item, str)]


def parse_vertex_record(obj: Any, line: int, require_reference: bool) -> tuple[Example | None, list[tuple[str, str]]]:
    """An Example from one decoded line of a Vertex dataset, or its problems (a ``RecordParser``)."""
    if not isinstance(obj, dict):
        return None, [("<line>", "must be a JSON object")]
    problems: list[tuple[str, str]] = []
    messages: list[dict[str, Any]] = []
    if "system_instruction" in obj and "systemInstruction" not in obj:
        obj = {("systemInstruction" if k == "system_instruction" else k): v for k, v in obj.items()}
    if "systemInstruction" in obj:
        system, system_problems = _system(obj["systemInstruction"])
        problems += system_problems
        messages += [system] if system else []
    turns, turn_problems = _contents(obj.get("contents")) if "contents" in obj else ([], [("contents", "is required")])
    problems += turn_problems
    problems += _references(obj.get("references"), require_reference)
    record_id = obj.get("id", f"line-{line}")
    if not isinstance(record_id, str | int):
        problems.append(("id", "must be a string"))
    if problems:
        return None, problems
    fields = {k: v for k, v in obj.items() if k not in VERTEX_KEYS}
    return Example(id=str(record_id), messages=messages + turns, fields=fields, line=line), []


def to_vertex_record(obj: dict[str, Any], reference_key: str = "ground_truth_answer") -> dict[str, Any]:
    """A messages-format line as a Vertex line (the inverse of ``parse_vertex_record``): a leading system
    message becomes ``systemInstruction``, ``reference_answer`` becomes ``references`` (a string under
    ``reference_key``, an object's values as strings), other fields stay."""
    messages = list(obj["messages"])
    line: dict[str, Any] = {k: v for k, v in obj.items() if k not in ("messages", "reference_answer", "tools")}
    if messages and messages[0]["role"] in ("system", "developer"):
        line["systemInstruction"] = {"parts": [{"text": messages.pop(0)["content"]}]}
    inverse = {"user": "user", "assistant": "model"}
    line["contents"] = [{"role": inverse[m["role"]], "parts": [{"text": m["content"]}]} for m in messages]
    reference = obj.get("reference_answer")
    if isinstance(reference, dict):
        line["references"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in reference.items()}
    elif reference is not None:  # a number, boolean or list as JSON text, as templates render it
        line["references"] = {reference_key: reference if isinstance(reference, str) else json.dumps(reference)}
    return line
