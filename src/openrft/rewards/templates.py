"""``{{ namespace.path }}`` templates: OpenAI's ``{{item.x}}``, ``{{sample.output_text}}``,
``{{sample.output_json.x}}`` and Vertex's ``{{references.key}}``, ``{{prompt}}``, ``{{response}}``.

A path is dotted, with list indices as ``.0`` or ``[0]``. Strings are inserted as they are; any
other value as compact JSON. A variable that does not resolve is an ``invalid_output`` failure
(the example lacks it); JSON output that does not parse is a ``parse_error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from openrft.rewards.input_limits import MAX_RENDERED_CHARS, too_large
from openrft.rewards.types import RewardFailure
from openrft.spec.errors import FieldProblem

PLACEHOLDER = re.compile(r"\{\{([^{}]*)\}\}")
"""``{{ path }}``; the path is the group stripped of whitespace. (Written with ``\\s*`` around a lazy group,
the pattern backtracked in cubic time: a 4 KB template of ``{{`` and spaces took 75 s.)"""
_MISSING = object()


def placeholders(template: str) -> list[str]:
    return [path.strip() for path in PLACEHOLDER.findall(template)]


def split_path(path: str) -> list[str]:
    return [p for p in re.split(r"\.|\[(\d+)\]", path) if p]


def lookup(value: Any, parts: list[str]) -> Any:
    """Walk ``parts`` into nested dicts and lists; ``_MISSING`` when a step does not exist."""
    for part in parts:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(template: str, resolve: Callable[[str], Any], escape: Callable[[str], str] | None = None) -> str:
    """Fill every placeholder with ``resolve(path)``; ``escape`` post-processes inserted text (regexes).
    The filled text is at most ``MAX_RENDERED_CHARS`` characters (else ``invalid_output`` naming the cap)."""
    size = len(template)

    def fill(match: re.Match) -> str:
        nonlocal size
        text = as_text(resolve(match.group(1).strip()))
        text = escape(text) if escape else text
        size += len(text)
        if size > MAX_RENDERED_CHARS:
            raise too_large(
                "a filled template", size, MAX_RENDERED_CHARS, "characters", "characters per filled template"
            )
        return text

    return PLACEHOLDER.sub(fill, template)


def parse_json_output(text: str) -> Any:
    """The completion as JSON (surrounding whitespace and a ```json fence allowed), or parse_error."""
    stripped = unfenced(text.strip())
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError) as exc:
        raise RewardFailure("parse_error", f"the output is not valid JSON ({exc.args[0]}): {text[:80]!r}") from None


def unfenced(text: str) -> str:
    """``text`` without a surrounding ```json fence, in linear time (the regex this replaces,
    ``\\s*(.*?)\\s*```, took 60 s on a 4 KB output of a fence and spaces)."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    inner = text[3:-3]
    return inner.removeprefix("json").strip()


class NamespaceResolver:
    """Resolves ``namespace.path`` against fixed roots; ``lazy`` roots are computed on first use."""

    def __init__(
        self,
        roots: Mapping[str, Any],
        lazy: Mapping[str, Callable[[], Any]] | None = None,
        allowed: tuple[str, ...] | None = None,
    ):
        self.roots = dict(roots)
        self.lazy = dict(lazy or {})
        self.allowed = allowed

    def __call__(self, path: str) -> Any:
        parts = split_path(path)
        if not parts:
            raise RewardFailure("invalid_output", "empty template variable {{}}")
        for size in range(len(parts), 0, -1):
            head = ".".join(parts[:size])
            if head in self.lazy:
                self.roots[head] = self.lazy.pop(head)()
            if head in self.roots:
                value = lookup(self.roots[head], parts[size:])
                if value is _MISSING:
                    raise RewardFailure(
                        "invalid_output", f"template variable {{{{{path[:100]}}}}} is not in this sample"
                    )
                return value
        raise RewardFailure("invalid_output", f"template variable {{{{{path[:100]}}}}} is not in this sample")


def unknown_namespaces(template: str, namespaces: tuple[str, ...]) -> list[str]:
    """Placeholders whose first segment (or whole name) is not one of ``namespaces``."""
    bad = []
    for path in placeholders(template):
        parts = split_path(path)
        if not parts or not any(
            path == ns or path.startswith(ns + ".") or path.startswith(ns + "[") for ns in namespaces
        ):
            bad.append(path)
    return bad


def check_template(template: str, namespaces: tuple[str, ...], path: str) -> list[FieldProblem]:
    """The problem of a template that names a namespace other than ``namespaces``, at ``path``."""
    bad = unknown_namespaces(template, namespaces)
    if not bad:
        return []
    names = ", ".join("{{" + b + "}}" for b in bad)
    allowed = ", ".join(
        "{{" + n + (".…" if n in ("item", "references", "sample.output_json") else "") + "}}" for n in namespaces
    )
    return [FieldProblem(path, f"uses {names}; allowed here: {allowed}")]
