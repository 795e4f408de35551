"""Bounds on user documents (job requests, recipes, graders): nesting depth and expanded size.

A YAML document can be small and still expand past any memory through aliases (``&a [*b, *b, ...]``
nested a few levels: 818 bytes that stand for billions of nodes), or nest deeper than the parsers
recurse. ``load_yaml`` and ``check_document`` refuse both with an error naming the bound, walking the
document without expanding it (at most ``MAX_NODES`` steps).
"""

from __future__ import annotations

from typing import Any

import yaml

from openrft.errors import OpenRFTError

MAX_DEPTH = 64
MAX_NODES = 200_000


class DocumentLimitError(OpenRFTError):
    """A document past one of the bounds; the message names the bound."""


def check_document(document: Any, what: str = "the document") -> None:
    """Raise DocumentLimitError when ``document`` nests deeper than MAX_DEPTH or holds (with aliases expanded)
    more than MAX_NODES values."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise DocumentLimitError(f"{what} holds more than {MAX_NODES:,} values (aliases counted expanded)")
        if depth > MAX_DEPTH:
            raise DocumentLimitError(f"{what} nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth + 1) for k in value if isinstance(k, tuple))
        elif isinstance(value, list | tuple):
            stack.extend((v, depth + 1) for v in value)


def load_yaml(text: str, what: str = "the document") -> Any:
    """``yaml.safe_load`` within the bounds (YAMLError for a syntax error, DocumentLimitError past a bound)."""
    try:
        document = yaml.safe_load(text)
    except RecursionError:
        raise DocumentLimitError(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    check_document(document, what)
    return document
