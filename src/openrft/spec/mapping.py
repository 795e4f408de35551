"""``--map FROM=TO``: run a published job as it is, with its cloud-only names mapped to local ones.

A published job names things that exist only in the cloud: a ``gs://``/``s3://`` dataset, a ``file-...``
id, a hosted base or judge model, a Cloud Run URL. Each mapping replaces every string value of the job
document that is exactly ``FROM`` by ``TO`` before the job is read, so the file itself stays as
published. A ``TO`` that names an existing local path, or any path given for an ``s3://``/``gs://`` location
or a file id (an output directory may not exist yet), is made absolute (relative to the working directory,
where the user typed it), since the dialects read relative paths from the job file's folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.locations import is_remote

FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]+$")


def parse_mappings(items: list[str] | None) -> dict[str, str]:
    """``["FROM=TO", ...]`` -> ``{FROM: TO}``; the first ``=`` splits (a URL may hold more)."""
    mappings: dict[str, str] = {}
    for item in items or []:
        source, sep, target = item.partition("=")
        if not sep or not source or not target:
            raise SpecError([FieldProblem("--map", "must be FROM=TO, e.g. --map file-abc=data/train.jsonl", item)])
        mappings[source] = _local(source, target)
    return mappings


def _local(source: str, target: str) -> str:
    """``target`` made absolute against the working directory when it is a local path: an existing one, or any
    path given for an object-store location or file id (an output directory that training will create)."""
    if "://" in target or is_remote(target):
        return target
    path = Path(target).expanduser()
    names_a_location = urlparse(source).scheme in ("s3", "gs", "gcs") or FILE_ID.match(source) is not None
    return str(path.resolve()) if path.exists() or names_a_location else target


def apply_mappings(document: Any, mappings: dict[str, str]) -> tuple[Any, set[str]]:
    """A copy of ``document`` with every string value equal to a key replaced; also the keys used."""
    used: set[str] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, str) and value in mappings:
            used.add(value)
            return mappings[value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(document), used


def unused_warnings(mappings: dict[str, str], used: set[str]) -> list[FieldProblem]:
    return [
        FieldProblem("--map", "matches no value of the job; nothing was mapped", source)
        for source in mappings
        if source not in used
    ]
