"""What a job valid as written still needs before it trains here: the references to what only its cloud has.

A published job names its service's model (``nova-lite-2/prod``, ``o4-mini``), its buckets (``s3://``,
``gs://``), OpenAI file ids, or leaves a Lambda or dataset blank for a notebook to fill in. None of that is
wrong in the job; it only has to be mapped to something local (``--map-model``, ``--map``, ``--map-lambda``)
or written in. ``spec validate`` reports such a job as valid with one line of what to map, and ``train``
refuses it until mapped.
"""

from __future__ import annotations

import dataclasses
import shlex

from openrft.spec.errors import FieldProblem, SpecError
from openrft.storage import StorageError, check_reachable, is_object_store


def pending_mappings(error: SpecError, output_field: str | None = None) -> list[FieldProblem] | None:
    """``error``'s problems, each with the remedy that maps it, when every one of them is a reference to be
    mapped; None when some problem is a real one (the job is not valid as written)."""
    locations = {field: value for value, field in error.partial.values() if field and isinstance(value, str)}
    pending = []
    for problem in error.problems:
        remedy = problem.remedy or _unreachable_store(problem, locations, output_field)
        if remedy is None:
            return None
        pending.append(dataclasses.replace(problem, remedy=remedy))
    return pending or None


def _unreachable_store(problem: FieldProblem, locations: dict[str, str], output_field: str | None) -> str | None:
    value = problem.value if isinstance(problem.value, str) else locations.get(problem.path)
    found = unreachable(value, problem.path, output=problem.path == output_field)
    return found.remedy if found else None


def unreachable(location: str | None, field: str, output: bool = False) -> FieldProblem | None:
    """When ``location`` is a bucket URI whose store this machine cannot reach at all: the problem at ``field``,
    mapped by ``--map URI=PATH`` (``--output DIR`` for an output location). None otherwise: a store that answers
    is checked for real."""
    if not is_object_store(location):
        return None
    try:
        check_reachable(location)
    except StorageError as exc:
        return FieldProblem(field, str(exc), remedy="--output DIR" if output else f"--map {location}=PATH")
    return None


def train_command(job: str, pending: list[FieldProblem]) -> str:
    """The one line that trains ``job`` here: ``openrft train JOB`` with every mapping option, and the fields to
    write first."""
    options = dict.fromkeys(p.remedy for p in pending if p.remedy.startswith("--"))
    writes = dict.fromkeys(p.remedy for p in pending if not p.remedy.startswith("--"))
    line = " ".join(["openrft train", shlex.quote(job), *options])
    return f"{', '.join(writes)}, then {line}" if writes else line
