"""Job files in any dialect -> JobSpec. The dialect is detected from the document's shape.

``resolve_document``/``resolve_job`` return a ``Resolution`` (the spec, where each value came from,
warnings); ``parse_document``/``load_job`` return the spec alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from openrft.spec.dialects import nova_jobs, openai, registry, vertex  # noqa: F401  (each registers itself)
from openrft.spec.dialects.common import DatasetSizer, count_examples
from openrft.spec.dialects.lambdas import resolve_handler
from openrft.spec.dialects.openai import FileResolver
from openrft.spec.document_limits import MAX_DEPTH, DocumentLimitError, check_document, load_yaml
from openrft.spec.errors import FieldProblem, SpecError, problems_from_validation
from openrft.spec.job import JobSpec
from openrft.spec.provenance import Resolution, Source, complete, leaf_paths
from openrft.spec.rewards import RewardSpec, reward_spec_from_document

Dialect = Literal["nova", "vertex", "openai", "canonical"]
DIALECTS: tuple[Dialect, ...] = ("nova", "vertex", "openai", "canonical")

__all__ = [
    "DIALECTS",
    "DatasetSizer",
    "Dialect",
    "FileResolver",
    "Resolution",
    "count_examples",
    "detect_dialect",
    "load_job",
    "load_reward_spec",
    "parse_document",
    "read_document",
    "resolve_document",
    "resolve_job",
]


def read_document(path: Path) -> Any:
    """A YAML or JSON file as Python data; a syntax error names the file and line."""
    if not path.is_file():
        raise SpecError([FieldProblem(str(path), "job file does not exist")])
    text = path.read_text()
    try:
        if path.suffix == ".json":
            document = json.loads(text)
            check_document(document, str(path))
            return document
        return load_yaml(text, str(path))
    except (DocumentLimitError, RecursionError) as exc:
        message = str(exc) if isinstance(exc, DocumentLimitError) else f"nests deeper than {MAX_DEPTH} levels"
        raise SpecError([FieldProblem(str(path), message)]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([FieldProblem(f"{path}:{exc.lineno}", f"is not valid JSON: {exc.msg}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError([FieldProblem(where, f"is not valid YAML: {getattr(exc, 'problem', exc)}")]) from None


def detect_dialect(document: Any) -> Dialect:
    found = registry.detected(document)
    if found is None:
        raise SpecError(
            [
                FieldProblem(
                    "<root>",
                    "is not a job in a known dialect: expected a Nova recipe (run, training_config) or Bedrock request "
                    "(hyperParameters), a Vertex request (reinforcementTuningSpec) or an OpenAI job "
                    "(method.type: reinforcement)",
                )
            ]
        )
    return found.name  # type: ignore[return-value]


def resolve_document(
    document: Any,
    dialect: Dialect | None = None,
    base_dir: Path | None = None,
    source: str | None = None,
    file_resolver: FileResolver | None = None,
    dataset_size: DatasetSizer | None = None,
) -> Resolution:
    """Resolve a parsed job document, with the provenance of every value.

    ``file_resolver`` maps the file ids an OpenAI job names (``training_file: file-abc``) to local paths;
    the job service passes its file store's. ``dataset_size`` counts the examples of a dataset location
    (epoch-based step counts need it); by default local files are counted and remote ones are an error
    where a count is needed.
    """
    dialect = dialect or detect_dialect(document)
    base_dir = base_dir or Path.cwd()
    resolution = _resolve_dialect(document, dialect, base_dir, source, file_resolver, dataset_size or count_examples)
    if resolution.spec.tools is not None:  # tool files are named relative to the job file
        resolution.spec.tools = resolution.spec.tools.relative_to(base_dir)
    if resolution.spec.rollout.agent is not None:  # so is an agent's file.py:function
        resolution.spec.rollout.agent = resolution.spec.rollout.agent.relative_to(base_dir)
    return resolution


def _resolve_dialect(
    document: Any,
    dialect: Dialect,
    base_dir: Path,
    source: str | None,
    file_resolver: FileResolver | None,
    sizer: DatasetSizer,
) -> Resolution:
    return registry.get(dialect).resolve(document, base_dir, source, file_resolver, sizer)


def _canonical(document: Any, _base_dir: Path, source: str | None, _files: Any, _sizer: Any) -> Resolution:
    try:
        spec = JobSpec.model_validate(document)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, JobSpec), source) from None
    written = {path: Source("user", path) for path in leaf_paths(document)}
    return Resolution(spec, complete(spec, written))


registry.register(
    registry.Dialect(
        "canonical",
        lambda document: isinstance(document, dict) and {"training", "model", "reward"} <= set(document),
        _canonical,
        order=90,
    )
)


def parse_document(
    document: Any,
    dialect: Dialect | None = None,
    base_dir: Path | None = None,
    source: str | None = None,
    file_resolver: FileResolver | None = None,
    dataset_size: DatasetSizer | None = None,
) -> JobSpec:
    """Resolve a parsed job document into a JobSpec (see ``resolve_document``)."""
    return resolve_document(document, dialect, base_dir, source, file_resolver, dataset_size).spec


def resolve_job(
    path: str | Path,
    dialect: Dialect | None = None,
    dataset_size: DatasetSizer | None = None,
    mappings: dict[str, dict[str, str]] | None = None,
    replacements: dict[str, str] | None = None,
) -> Resolution:
    """Read a job file in any dialect and resolve it, with provenance and warnings.

    ``mappings`` adds to the job's ``openrft`` block without editing the file, e.g. ``{"lambda_map": {ARN:
    "reward.py:lambda_handler"}, "model_map": {"nova-lite-2/prod": "openrft-demo"}}`` (the CLI's
    ``--map-lambda``/``--map-model``); they take precedence over the file's own entries. ``replacements``
    (the CLI's ``--map FROM=TO``) replace values of the document that are exactly FROM (a dataset URI, a
    file id, a judge model, a reward URL) before it is read (``openrft.spec.mapping``)."""
    from openrft.spec.mapping import apply_mappings, unused_warnings

    path = Path(path)
    document = read_document(path)
    used: set[str] = set()
    if replacements:
        document, used = apply_mappings(document, replacements)
    if mappings and any(mappings.values()):
        document = with_mappings(document, mappings, str(path))
    resolution = resolve_document(document, dialect, path.resolve().parent, str(path), dataset_size=dataset_size)
    if replacements:
        resolution.warnings.extend(unused_warnings(replacements, used))
    return resolution


def with_mappings(document: Any, mappings: dict[str, dict[str, str]], source: str) -> Any:
    """``document`` with ``mappings`` merged into its ``openrft`` block."""
    if not isinstance(document, dict) or not isinstance(document.get("openrft", {}), dict):
        raise SpecError([FieldProblem("openrft", "must be a mapping to take --map-lambda/--map-model")], source)
    block = dict(document.get("openrft") or {})
    for name, entries in mappings.items():
        if entries:
            block[name] = {**(block.get(name) or {}), **entries}
    return {**document, "openrft": block}


def load_job(path: str | Path, dialect: Dialect | None = None) -> JobSpec:
    """Read a job file in any dialect and resolve it into a JobSpec."""
    return resolve_job(path, dialect).spec


def load_reward_spec(path: str | Path) -> RewardSpec:
    """A reward config file (any shape ``reward_spec_from_document`` reads), a job file's reward, or a published
    Lambda file named ``reward.py:lambda_handler``."""
    handler = resolve_handler(str(path), Path.cwd())
    if handler is not None:
        return RewardSpec.model_validate({"function": {"type": "nova_lambda", "endpoint": handler}})
    path = Path(path)
    document = read_document(path)
    if isinstance(document, dict) and (
        "training_config" in document or "run" in document or ("training" in document and "reward" in document)
    ):
        detect_dialect(document)
        return load_job(path).reward
    return reward_spec_from_document(document, str(path))
