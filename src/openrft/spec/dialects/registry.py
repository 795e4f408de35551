"""The job dialects by name: how each detects its documents, resolves them, and where its documents name what the
service and the SDK read (datasets, model, reward, output, tracking, replicas, the job's display fields).

Each dialect module registers one ``Dialect`` when it is imported (``spec.dialects`` imports them in detection
order); nothing outside ``spec.dialects`` and the routes compares dialect names: it asks here. A new dialect is
one module that registers itself, its tests, and, if the service takes it on a route of its own, one route
module (docs/design.md, "Extending").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrft.spec.provenance import Resolution

FieldPath = tuple[str, ...]
FileResolver = Callable[[str], str]
DatasetSizer = Callable[[str], int]
Resolver = Callable[[Any, Path, "str | None", "FileResolver | None", DatasetSizer], Resolution]


@dataclass(frozen=True)
class DocumentFields:
    """Where a dialect's job documents name what the service and the SDK read, as dotted field paths."""

    train: str
    validation: str
    model: str
    reward: str
    output: str
    tracking: str  # the block holding mlflow_tracking_uri and its siblings
    replicas: str  # the learner count's field, for the cluster's size check
    display_name: str | None = None  # the job's display name, where the dialect has one (else the spec's name)
    user_metadata: str | None = None  # the user's labels or metadata kept on the job
    suffix: str | None = None  # OpenAI's fine-tuned model suffix
    resolves_file_ids: bool = False  # the parser maps file ids itself (a file resolver); else the service does
    entry_fields: Callable[[Any], dict[str, str]] | None = None
    """Spec paths -> a document's fields that set them, where no fixed path names them (an entry of a list)."""

    @property
    def data(self) -> tuple[FieldPath, FieldPath]:
        return tuple(self.train.split(".")), tuple(self.validation.split("."))  # type: ignore[return-value]


@dataclass(frozen=True)
class Dialect:
    name: str
    detect: Callable[[Any], bool]  # whether a document is one of this dialect's
    resolve: Resolver  # document, base_dir, source, file resolver, dataset sizer -> Resolution
    fields: DocumentFields | None = None  # None: not taken by the service (the canonical spec)
    order: int = 50  # detection tries lower first (a Nova recipe's run block before anything else)


_DIALECTS: dict[str, Dialect] = {}


def register(dialect: Dialect) -> Dialect:
    if dialect.name in _DIALECTS:
        raise ValueError(f"dialect {dialect.name!r} is registered twice")
    _DIALECTS[dialect.name] = dialect
    return dialect


def names() -> tuple[str, ...]:
    """Every registered dialect, in detection order."""
    return tuple(d.name for d in sorted(_DIALECTS.values(), key=lambda d: d.order))


def get(name: str) -> Dialect:
    try:
        return _DIALECTS[name]
    except KeyError:
        raise KeyError(f"no dialect {name!r}; known: {', '.join(_DIALECTS)}") from None


def detected(document: Any) -> Dialect | None:
    """The first dialect, in detection order, whose documents look like ``document``."""
    return next((d for d in sorted(_DIALECTS.values(), key=lambda d: d.order) if d.detect(document)), None)


def service_dialects() -> tuple[str, ...]:
    """The dialects the job service takes."""
    return tuple(name for name in names() if _DIALECTS[name].fields is not None)


def fields(name: str) -> DocumentFields:
    found = get(name).fields
    if found is None:
        raise KeyError(f"the job service does not take {name!r} documents; it takes {', '.join(service_dialects())}")
    return found
