"""Where each value of a resolved JobSpec came from: the user's own field, a default, or a derivation.

The dialect parsers record a ``Source`` for every canonical field they set while resolving a job
(``spec.dialects.builder.SpecBuilder``); every field they leave alone is OpenRFT's own default.
``openrft spec explain`` prints the result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from openrft.spec.errors import FieldProblem
from openrft.spec.job import JobSpec
from openrft.spec.tools import masked_headers

Origin = Literal["user", "default", "derived"]

OPENRFT_DEFAULT = "OpenRFT default"


@dataclass(frozen=True)
class Source:
    """``origin`` of one canonical value; ``field`` is the user's field path it was read from or derived
    from (in the user's dialect), ``note`` says which default applies or how a value was computed."""

    origin: Origin
    field: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Resolution:
    """A resolved job: the spec, where each of its values came from, and the warnings of the request."""

    spec: JobSpec
    provenance: dict[str, Source]
    warnings: list[FieldProblem] = field(default_factory=list)
    dataset_prompts: int | None = None

    @property
    def total_steps(self) -> int:
        return self.spec.training.total_steps

    def to_json(self) -> dict[str, Any]:
        """The resolved spec as JSON with ``total_steps``, provenance and warnings beside its fields."""
        return {
            "total_steps": self.total_steps,
            **masked_headers(self.spec.model_dump(mode="json")),  # tools' headers hold tokens
            "dataset_prompts": self.dataset_prompts,
            "provenance": {path: source.to_json() for path, source in self.provenance.items()},
            "warnings": [str(w) for w in self.warnings],
        }


def leaf_paths(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of the leaves of nested dicts (lists and empty dicts are leaves)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(leaf_paths(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def complete(spec: JobSpec, recorded: dict[str, Source]) -> dict[str, Source]:
    """Every leaf of ``spec`` with its source: the recorded one (its own, or a recorded parent's), else
    OpenRFT's default. Ordered as the spec's fields."""
    out: dict[str, Source] = {}
    for path in leaf_paths(spec.model_dump(mode="json")):
        parent = next((p for p in _prefixes(path) if p in recorded), None)
        if parent is None:
            out[path] = Source("default", None, OPENRFT_DEFAULT)
        elif parent not in out:
            out[parent] = recorded[parent]
    return out


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
