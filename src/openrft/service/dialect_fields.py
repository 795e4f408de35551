"""Reading and writing a field of a job document by its path (each dialect's paths: ``spec.dialects.registry``)."""

from __future__ import annotations

from typing import Any

FieldPath = tuple[str, ...]


def get_field(document: Any, path: FieldPath) -> Any:
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def set_field(document: dict, path: FieldPath, value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value
