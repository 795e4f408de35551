"""Job files in any dialect -> JobSpec. The dialect is detected from the document's shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.job import JobSpec

Dialect = Literal["nova", "vertex", "openai", "canonical"]


def read_document(path: Path) -> Any:
    """A YAML or JSON file as Python data; a syntax error names the file and line."""
    if not path.is_file():
        raise SpecError([FieldProblem(str(path), "job file does not exist")])
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError([FieldProblem(f"{path}:{exc.lineno}", f"is not valid JSON: {exc.msg}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError([FieldProblem(where, f"is not valid YAML: {getattr(exc, 'problem', exc)}")]) from None


def detect_dialect(document: Any) -> Dialect:
    if isinstance(document, dict):
        if "training_config" in document or "run" in document:
            return "nova"
        if "reinforcementTuningSpec" in document:
            return "vertex"
        if "method" in document or "training_file" in document:
            return "openai"
        if "training" in document and "model" in document and "reward" in document:
            return "canonical"
    raise SpecError(
        [
            FieldProblem(
                "<root>",
                "is not a job in a known dialect: expected a Nova recipe (run, training_config), a Vertex "
                "request (reinforcementTuningSpec) or an OpenAI job (method.type: reinforcement)",
            )
        ]
    )


FileResolver = Callable[[str], str]


def parse_document(document: Any, dialect: Dialect | None = None, base_dir: Path | None = None,
                   source: str | None = None, file_resolver: FileResolver | None = None) -> JobSpec:
    """Resolve a parsed job document. ``file_resolver`` maps the file ids an OpenAI job names
    (``training_file: file-abc``) to local paths; the job service passes its file store's."""
    dialect = dialect or detect_dialect(document)
    base_dir = base_dir or Path.cwd()
    if dialect == "nova":
        from openrft.spec.dialects.nova import parse_recipe

        return parse_recipe(document, base_dir, source)
    if dialect == "canonical":
        from pydantic import ValidationError

        from openrft.spec.errors import problems_from_validation

        try:
            return JobSpec.model_validate(document)
        except ValidationError as exc:
            raise SpecError(problems_from_validation(exc), source) from None
    raise SpecError([FieldProblem("<root>", f"the {dialect} dialect is not available in this build")], source)


def load_job(path: str | Path, dialect: Dialect | None = None) -> JobSpec:
    """Read a job file in any dialect and resolve it into a JobSpec."""
    path = Path(path)
    document = read_document(path)
    return parse_document(document, dialect, path.resolve().parent, str(path))
