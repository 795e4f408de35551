"""Chat messages -> prompt token ids through the model's chat template.

Chat templates differ in what they expect of the ``tools`` and of the calls in history; each template gets
what it needs (``TemplateNeeds``, found once per template by rendering a small conversation):

- a call's ``arguments`` as a JSON string where the template concatenates them (DeepSeek-V3/R1/V3.1's
  ``... + tool['function']['arguments'] + ...``); a dict otherwise (transformers' convention, what
  ``| tojson`` templates want);
- an empty ``description`` for a tool without one where the template reads it unconditionally (gpt-oss,
  Hermes-3);
- the tools as a JSON string in the system message's ``tools`` field where the template reads them there and
  never reads the ``tools`` variable (Phi-4-mini).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

REASONING_ON = ("low", "medium", "high")


@dataclass(frozen=True)
class TemplateNeeds:
    string_arguments: bool = False  # history calls' arguments as JSON strings
    descriptions: bool = False  # every tool has a description ("" when it had none)
    system_tools: bool = False  # the tools as JSON in the system message's "tools" field


_NEEDS: dict[str, TemplateNeeds] = {}
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "probe", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
]
_SYSTEM_TOOLS = re.compile(r"""message\s*(?:\[\s*['"]tools['"]\s*\]|\.tools\b)|['"]tools['"]\s+in\s+message""")


def _reads_system_tools(template: str) -> bool:
    """The template reads the tools from the system message and never reads the ``tools`` variable."""
    if not _SYSTEM_TOOLS.search(template):
        return False
    try:
        from jinja2 import Environment, meta

        parsed = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except Exception:
        return False
    return "tools" not in meta.find_undeclared_variables(parsed)


def template_needs(tokenizer) -> TemplateNeeds:
    """What the tokenizer's chat template needs (see the module docstring); found once per template."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return TemplateNeeds()
    if template in _NEEDS:
        return _NEEDS[template]
    system_tools = _reads_system_tools(template)
    needs = TemplateNeeds(system_tools=system_tools)
    call = {"id": "call01000", "type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}
    probe = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call01000", "name": "probe", "content": "1"},
    ]
    for candidate in (
        needs,
        TemplateNeeds(descriptions=True, system_tools=system_tools),
        TemplateNeeds(string_arguments=True, system_tools=system_tools),
        TemplateNeeds(string_arguments=True, descriptions=True, system_tools=system_tools),
    ):
        messages, tools = adapted(candidate, probe, _PROBE_TOOLS)
        try:
            tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        except Exception:
            continue
        needs = candidate
        break
    _NEEDS[template] = needs
    return needs


def adapted(
    needs: TemplateNeeds, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``messages`` and ``tools`` as the template needs them (unchanged when it needs nothing)."""
    if tools and needs.descriptions:
        tools = [
            {**t, "function": {**t["function"], "description": t["function"].get("description") or ""}}
            if isinstance(t.get("function"), dict)
            else t
            for t in tools
        ]
    if needs.string_arguments:
        messages = [
            {**m, "tool_calls": [_string_arguments(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages
        ]
    if tools and needs.system_tools:
        listed = json.dumps([t.get("function", t) for t in tools], ensure_ascii=False)
        if messages and messages[0].get("role") == "system":
            messages = [{**messages[0], "tools": listed}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": "", "tools": listed}, *messages]
    return messages, tools


def _string_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or isinstance(function.get("arguments"), str):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(function.get("arguments"), ensure_ascii=False)}}


def template_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A call as chat templates expect it in history: ``arguments`` a dict (transformers' convention), where an
    OpenAI client sends a JSON string."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except (TypeError, ValueError):
        arguments = function["arguments"]
    return {**call, "function": {"name": function["name"], "arguments": arguments}}


def openai_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An OpenAI request's messages as chat templates take them (each call's arguments a dict)."""
    return [
        {**m, "tool_calls": [template_arguments(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]


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
    """The chat template's text of a conversation (see ``render_prompt`` for the reasoning settings), the
    messages and tools given as the template needs them (``template_needs``)."""
    messages, tools = adapted(template_needs(tokenizer), messages, tools)
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        enable_thinking=reasoning_effort in REASONING_ON,
        reasoning_effort=reasoning_effort or "low",
    )
