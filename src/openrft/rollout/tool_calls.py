"""Tool calls parsed from a model's text, in the formats the chat templates of common open models teach.

- Hermes style (Qwen2.5, Qwen3, NousResearch Hermes 2/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call; Qwen3-Coder writes the block's body as XML:
  ``<function=NAME><parameter=KEY>VALUE</parameter></function>``.
- Llama 3.1/3.2/3.3 JSON: ``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or bare (several
  separated by ``;``). Llama 3.2/4 "pythonic": ``[name(key=value, ...), ...]``.
- Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` or ``[TOOL_CALLS]name[ARGS]{...}``.
- gpt-oss harmony: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
  (``openrft.rollout.harmony``; read from the text with its special tokens kept).
- DeepSeek (V3, R1): ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` then a fenced JSON body and
  ``<｜tool▁call▁end｜>``; DeepSeek-V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``;
  both inside ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`` (their published templates).
- Phi-4-mini: ``functools[{"name": ..., "arguments": {...}}, ...]`` (its model card's format).

Markup that names no tag (bare JSON, pythonic) counts as a call only when every name in it is a tool the row
offers, so an answer that merely is JSON is not taken for a call. Calls come out in OpenAI's shape,
``{"id", "type": "function", "function": {"name", "arguments": "<JSON string>"}}``; a block that cannot be
read is reported in ``malformed`` (its text), never dropped silently.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from openrft.rollout.harmony import is_harmony, parse_harmony

HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
QWEN_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
QWEN_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|\Z)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"
FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)
DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
DEEPSEEK_CALLS_END = "<｜tool▁calls▁end｜>"
DEEPSEEK_CALL = "<｜tool▁call▁begin｜>"
DEEPSEEK_CALL_END = "<｜tool▁call▁end｜>"
DEEPSEEK_SEP = "<｜tool▁sep｜>"
PHI_TAG = "functools["
CALL_MARKERS = ("<tool_call>", PYTHON_TAG, MISTRAL_TAG, DEEPSEEK_CALLS, DEEPSEEK_CALL)
"""Markup that may be special tokens of a tokenizer (decoding drops them): calls are read with them kept."""


@dataclass
class ParsedOutput:
    """The model's text split into its message content and its tool calls (OpenAI's shape)."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    """The function names of an OpenAI ``tools`` list."""
    return {t["function"]["name"] for t in tools or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)}


def openai_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    """One call in OpenAI's shape; ``arguments`` always a JSON string, as the API gives it."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _json_call(obj: Any) -> tuple[str, Any] | None:
    """``(name, arguments)`` from ``{"name", "arguments"|"parameters"}`` (OpenAI's nested ``function`` too)."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return name, arguments


def _json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, separated by whitespace, ``;`` or ``,``; None if anything else is there."""
    decoder = json.JSONDecoder()
    values, position, text = [], 0, text.strip()
    while position < len(text):
        try:
            value, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):  # deeply nested brackets raise RecursionError
            return None
        values.append(value)
        while position < len(text) and text[position] in " \t\r\n;,":
            position += 1
    return values


def _flatten(values: list[Any]) -> list[Any]:
    return [item for value in values for item in (value if isinstance(value, list) else [value])]


def _hermes(text: str) -> tuple[str, list[tuple[str, Any]], list[str]]:
    calls, malformed = [], []
    for match in HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        xml = QWEN_XML_FUNCTION.findall(body)
        if xml:
            for name, params in xml:
                arguments = {key: _xml_value(value) for key, value in QWEN_XML_PARAMETER.findall(params)}
                calls.append((name.strip(), arguments))
            continue
        values = _json_values(body)
        parsed = [_json_call(v) for v in _flatten(values)] if values else [None]
        if all(p is not None for p in parsed):
            calls += parsed
        else:
            malformed.append(match.group(0))
    return HERMES_BLOCK.sub("", text).strip(), calls, malformed


def _xml_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _tagged_json(text: str, tag: str) -> tuple[str, list[tuple[str, Any]], list[str]]:
    """Llama's ``<|python_tag|>`` or Mistral's ``[TOOL_CALLS]``: content before the tag, JSON calls after it."""
    content, _, rest = text.partition(tag)
    if tag == MISTRAL_TAG and MISTRAL_ARGS in rest:
        return content.strip(), *_mistral_args(rest)
    values = _json_values(rest)
    parsed = [_json_call(v) for v in _flatten(values)] if values else [None]
    if all(p is not None for p in parsed):
        return content.strip(), parsed, []
    return content.strip(), [], [tag + rest]


def _mistral_args(rest: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """``name[ARGS]{...}`` repeated (Mistral's newer templates), each optionally after another ``[TOOL_CALLS]``."""
    calls, malformed = [], []
    for chunk in rest.split(MISTRAL_TAG):
        if not chunk.strip():
            continue
        name, _, arguments = chunk.partition(MISTRAL_ARGS)
        name = name.partition(MISTRAL_CALL_ID)[0]  # [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} (v11 tokenizers)
        values = _json_values(arguments)
        if name.strip() and values and len(values) == 1 and isinstance(values[0], dict):
            calls.append((name.strip(), values[0]))
        else:
            malformed.append(MISTRAL_TAG + chunk)
    return calls, malformed


def _deepseek(text: str) -> tuple[str, list[tuple[str, Any]], list[str]]:
    """DeepSeek's call blocks: ``function<｜tool▁sep｜>NAME`` then a fenced JSON body (V3, R1), or
    ``NAME<｜tool▁sep｜>{...}`` (V3.1); the content is the text before the first block."""
    start = text.find(DEEPSEEK_CALLS)
    if start < 0:
        start = text.find(DEEPSEEK_CALL)
    content, rest = text[:start], text[start:].replace(DEEPSEEK_CALLS, "").split(DEEPSEEK_CALLS_END)[0]
    calls, malformed = [], []
    for chunk in rest.split(DEEPSEEK_CALL)[1:]:
        body = chunk.split(DEEPSEEK_CALL_END)[0]
        head, sep, tail = body.partition(DEEPSEEK_SEP)
        if head.strip() == "function" and not tail.lstrip().startswith("{"):  # V3 / R1: the type, then the name
            name, _, arguments = tail.partition("\n")
            fence = FENCE.search(arguments)
            arguments = fence.group(1) if fence else arguments
        else:
            name, arguments = head, tail
        values = _json_values(arguments) if sep else None
        if name.strip() and values and len(values) == 1 and isinstance(values[0], dict):
            calls.append((name.strip(), values[0]))
        else:
            malformed.append(DEEPSEEK_CALL + chunk)
    return content.strip(), calls, malformed


def _phi(text: str) -> tuple[str, list[tuple[str, Any]], list[str]]:
    """Phi-4-mini's ``functools[{...}, ...]``: a JSON list of ``{"name", "arguments"}`` after the tag."""
    content, _, rest = text.partition(PHI_TAG)
    values = _json_values("[" + rest)
    parsed = [_json_call(v) for v in _flatten(values)] if values else [None]
    if parsed and all(p is not None for p in parsed):
        return content.strip(), parsed, []  # type: ignore[return-value]
    return content.strip(), [], [PHI_TAG + rest]


def _untagged(text: str, names: Collection[str]) -> list[tuple[str, Any]] | None:
    """Bare JSON or pythonic calls filling the whole text, naming only offered tools; else None."""
    stripped = text.strip()
    fence = FENCE.fullmatch(stripped)
    if fence:
        stripped = fence.group(1)
    if not stripped or not names:
        return None
    values = _json_values(stripped)
    if values:
        parsed = [_json_call(v) for v in _flatten(values)]
        if all(p is not None and p[0] in names for p in parsed):
            return parsed  # type: ignore[return-value]
        return None
    return _pythonic(stripped, names)


def _pythonic(text: str, names: Collection[str]) -> list[tuple[str, Any]] | None:
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # too deeply nested, null bytes
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names):
            return None
        if node.args:
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, RecursionError, MemoryError):  # not a literal; an unhashable key
            return None
        calls.append((node.func.id, arguments))
    return calls


def parse_tool_calls(text: str, names: Collection[str] = (), id_prefix: str = "call_") -> ParsedOutput:
    """The tool calls in ``text`` (any of the formats above) and the text without them.

    ``names``: the tools the row offers; bare (untagged) calls must name one of them. Call ids are
    ``{id_prefix}{index}``: give each turn of a conversation its own prefix so that ids stay unique.
    """
    malformed: list[str] = []
    if "<tool_call>" in text:
        content, found, malformed = _hermes(text)
    elif PYTHON_TAG in text:
        content, found, malformed = _tagged_json(text, PYTHON_TAG)
    elif MISTRAL_TAG in text:
        content, found, malformed = _tagged_json(text, MISTRAL_TAG)
    elif DEEPSEEK_CALLS in text or DEEPSEEK_CALL in text:
        content, found, malformed = _deepseek(text)
    elif PHI_TAG in text:
        content, found, malformed = _phi(text)
    elif is_harmony(text):
        content, found, malformed = parse_harmony(text)
    else:
        untagged = _untagged(text, names)
        content, found = ("", untagged) if untagged else (text, [])
    calls = [openai_call(name, arguments, f"{id_prefix}{i}") for i, (name, arguments) in enumerate(found)]
    return ParsedOutput(content=content, calls=calls, malformed=malformed)
