"""One dataset line -> an Example, or the list of what is wrong with it (CONTRACTS.md §1 rules)."""

from __future__ import annotations

from typing import Any

from openrft.data.records import Example

ROLES = ("system", "user", "assistant", "tool", "developer")


def _content_text(content: Any) -> str | None:
    """Message content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def check_messages(messages: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Normalised messages and a list of (field, problem)."""
    if not isinstance(messages, list) or not messages:
        return [], [("messages", "must be a non-empty list of {role, content} objects")]
    problems: list[tuple[str, str]] = []
    normalised: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            problems.append((where, "must be an object with role and content"))
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append((f"{where}.role", f"{role!r} is not one of {', '.join(ROLES)}"))
            continue
        text = _content_text(message.get("content"))
        if text is None and not (role == "assistant" and message.get("tool_calls")):
            problems.append((f"{where}.content", "must be a string or a list of text parts"))
            continue
        normalised.append({**message, "role": "system" if role == "developer" else role, "content": text or ""})
    roles = [m["role"] for m in normalised]
    if "system" in roles[1:]:
        problems.append(("messages", "a system (or developer) message may only come first"))
    if "user" not in roles and not problems:
        problems.append(("messages", "needs at least one user message"))
    return normalised, problems


def check_tools(tools: Any) -> list[tuple[str, str]]:
    if not isinstance(tools, list):
        return [("tools", "must be a list of {type: function, function: {name, description, parameters}}")]
    problems = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            problems.append((f"tools[{i}]", "must be {type: function, function: {...}}"))
            continue
        name = function.get("name")
        if not isinstance(name, str) or not name:
            problems.append((f"tools[{i}].function.name", "must be a non-empty string"))
        elif name in names:
            problems.append((f"tools[{i}].function.name", f"{name!r} is used by another tool"))
        else:
            names.add(name)
    return problems


def check_reference(value: Any, required: bool) -> list[tuple[str, str]]:
    """``reference_answer`` is any JSON value the services pass on (a string, a number, a boolean, a list, an
    object): OpenAI's item namespace and the Lambda events carry it as written. Only an empty one is refused,
    since a reward has nothing to compare with."""
    if value is None:
        return [("reference_answer", "is required by this job's reward")] if required else []
    if isinstance(value, str | list | dict) and not (value.strip() if isinstance(value, str) else value):
        return [("reference_answer", f"is empty ({value!r}): give the answer (a string, number, list or object)")]
    return []


def parse_record(obj: Any, line: int, require_reference: bool) -> tuple[Example | None, list[tuple[str, str]]]:
    """An Example from one decoded JSON line in the messages format, or its problems."""
    if not isinstance(obj, dict):
        return None, [("<line>", "must be a JSON object")]
    problems: list[tuple[str, str]] = []
    messages, message_problems = (
        check_messages(obj.get("messages")) if "messages" in obj else ([], [("messages", "is required")])
    )
    problems += message_problems
    problems += check_reference(obj.get("reference_answer"), require_reference)
    if "tools" in obj:
        problems += check_tools(obj["tools"])
    record_id = obj.get("id", f"line-{line}")
    if not isinstance(record_id, str | int):
        problems.append(("id", "must be a string"))
    if problems:
        return None, problems
    fields = {k: v for k, v in obj.items() if k not in ("messages", "tools")}
    return Example(id=str(record_id), messages=messages, fields=fields, tools=obj.get("tools"), line=line), []
