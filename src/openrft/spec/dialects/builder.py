"""Build a JobSpec value by value, recording where each value came from.

A dialect sets canonical fields (``training.total_steps``) from its own fields, saying for each
whether the user wrote it, a default filled it in, or it was derived. Validation errors of the
canonical spec are reported at the user's field the value came from, not at the canonical path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from openrft.spec.error_paths import user_loc
from openrft.spec.errors import FieldProblem, SpecError, join_path, problems_from_validation
from openrft.spec.job import JobSpec
from openrft.spec.locations import resolve_location
from openrft.spec.provenance import Origin, Resolution, Source, complete

_RAW = object()
CLOUD_ONLY_MODEL = re.compile(
    r"^(amazon\.nova|nova-(micro|lite|pro|premier)|arn:aws(-[a-z]+)?:(bedrock|sagemaker):|[a-z0-9-]+\.[\w.-]+:\d+"
    r"|gemini-|projects/[^/]+/locations/[^/]+/(models|endpoints|publishers)/"
    r"|ft:|gpt-(3\.5|4|5)|o[1-9](-|$)|(babbage|davinci)-0"
    r"|(openai|qwen|meta|mistral|deepseek|amazon|anthropic|cohere|nvidia|google|moonshotai|minimax)\.[\w.:-]+$)"
)
"""Amazon Nova models (``nova-lite-2/prod``, ``amazon.nova-2-lite-v1:0:256k``), Bedrock model ids
(``openai.gpt-oss-20b-1:0``, and without a version as Bedrock's OpenAI-compatible API names them:
``openai.gpt-oss-20b``), Bedrock/SageMaker ARNs, Gemini models and Vertex resource names, and OpenAI's
hosted models (``o4-mini-2025-04-16``, ``gpt-4.1``, ``ft:...``; not the open-weight ``openai/gpt-oss-*``)."""


class SpecBuilder:
    def __init__(self, problems: list[FieldProblem] | None = None) -> None:
        """``problems``: those already found in the request (``validate_all``), reported with the resolver's."""
        self.values: dict[str, Any] = {}
        self.sources: dict[str, Source] = {}
        self.problems: list[FieldProblem] = list(problems or [])
        self.warnings: list[FieldProblem] = []
        self.model_map: dict[str, str] = {}
        self.mapped_model: str | None = None
        """The job's own model name when ``model_map`` replaced it (``model`` records it)."""

    def set(self, path: str, value: Any, origin: Origin, field: str | None = None, note: str | None = None) -> Any:
        self.values[path] = value
        self.sources[path] = Source(origin, field, note)
        return value

    def user(self, path: str, value: Any, field: str) -> Any:
        return self.set(path, value, "user", field)

    def default(self, path: str, value: Any, field: str | None = None, note: str | None = None) -> Any:
        return self.set(path, value, "default", field, note)

    def derived(self, path: str, value: Any, note: str, field: str | None = None) -> Any:
        return self.set(path, value, "derived", field, note)

    def take(
        self, path: str, model: BaseModel, name: str, field: str, value: Any = _RAW, note: str | None = None
    ) -> Any:
        """Copy ``model.name`` (or ``value``, a translation of it) to ``path``: ``user`` if the user wrote the
        field, else ``default`` (the dialect's documented default)."""
        result = getattr(model, name) if value is _RAW else value
        origin: Origin = "user" if was_set(model, name) else "default"
        return self.set(path, result, origin, field, note)

    def model(self, value: str, base_dir: Path, field: str) -> str:
        """The base model: a name is kept; a path (absolute, ``file://`` or relative to the job file that
        exists) must be a directory, else a problem at the user's field. A name in ``model_map``
        (``openrft.model_map``, ``--map-model``) is replaced by its local model; a model that only runs
        in a cloud service (Amazon Nova, a Bedrock ARN) must be mapped."""
        if value in self.model_map:
            self.mapped_model = value
            location = resolve_location(self.model_map[value], base_dir, model=True)
            if Path(location).is_absolute() and not Path(location).is_dir():
                self.problem(f"openrft.model_map.{value}", "is not an existing model directory", location)
            return self.set(
                "model.name_or_path", location, "user", field, f"{value!r} mapped by --map-model / openrft.model_map"
            )
        if CLOUD_ONLY_MODEL.match(value):
            self.problem(
                field,
                f"is a model that runs only in its cloud service: map it to a local or Hugging Face model with "
                f"--map-model '{value}=openrft-demo' (or openrft.model_map)",
                value,
                remedy=f"--map-model '{value}=MODEL'",
            )
            return self.user("model.name_or_path", value, field)
        location = resolve_location(value, base_dir, model=True)
        if Path(location).is_absolute() and not Path(location).is_dir():
            self.problem(field, "is not an existing model directory", value)
        return self.user("model.name_or_path", location, field)

    def problem(self, path: str, message: str, value: Any = ..., remedy: str | None = None) -> None:
        """A problem at the user's field ``path``; ``remedy``: see ``FieldProblem``."""
        if value is ...:
            self.problems.append(FieldProblem(path, message, remedy=remedy))
        else:
            self.problems.append(FieldProblem(path, message, value, remedy))

    def warn(self, path: str, message: str, value: Any = ...) -> None:
        self.warnings.append(FieldProblem(path, message) if value is ... else FieldProblem(path, message, value))

    def build(self, source: str | None, dataset_prompts: int | None = None) -> Resolution:
        """The JobSpec, or a SpecError with every problem recorded so far and every canonical one."""
        self._warn_degenerate()
        if self.problems:
            unique = {p.path: p for p in reversed(self.problems)}  # one problem per field: the first found
            error = SpecError([p for p in self.problems if unique[p.path] is p], source)
            error.partial = {path: (value, self.sources[path].field) for path, value in self.values.items()}
            raise error
        nested: dict[str, Any] = {}
        for path, value in self.values.items():
            *parents, last = path.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        try:
            spec = JobSpec.model_validate(nested)
        except ValidationError as exc:
            raise SpecError(self._user_problems(exc), source) from None
        return Resolution(spec, complete(spec, self.sources), list(self.warnings), dataset_prompts)

    def _warn_degenerate(self) -> None:
        """Warnings for settings that are valid but do nothing, or stop learning, at the user's field."""
        values = self.values
        samples = values.get("sampling.samples_per_prompt", 4)
        if samples > 1 and (values.get("sampling.top_k") == 1 or values.get("sampling.temperature") == 0):
            name = "sampling.top_k" if values.get("sampling.top_k") == 1 else "sampling.temperature"
            self.warn(
                self._field(name),
                f"makes sampling greedy: the {samples} samples of a prompt are identical, so every group's "
                "rewards are equal and every advantage is 0 (nothing is learned); use top_k 0 (off) or a "
                "larger one, and a temperature above 0",
                values[name],
            )
        if values.get("lora.enabled") is False:
            for path in ("lora.rank", "lora.alpha", "lora.lora_plus_lr_ratio", "lora.dropout"):
                source = self.sources.get(path)
                if source is not None and source.origin == "user":
                    self.warn(
                        self._field(path),
                        "has no effect: this job trains all weights (full rank); add a peft block with "
                        "peft_scheme: lora to train a LoRA adapter",
                        values[path],
                    )
        replicas = values.get("rollout.generation_replicas", 1)
        if replicas > 1 and values.get("rollout.strategy", "sync") == "sync":
            self.warn(
                self._field("rollout.generation_replicas"),
                "has no effect with the sync rollout strategy (the learner's process generates); "
                "generation replicas serve off_policy_async",
                replicas,
            )

    def _field(self, path: str) -> str:
        """The user's field a canonical value came from (the canonical path when none)."""
        source = self.sources.get(path)
        return source.field if source and source.field else path

    def _user_problems(self, exc: ValidationError) -> list[FieldProblem]:
        """Canonical validation errors, each at the user's field its value came from when there is one."""
        out = []
        for problem, item in zip(problems_from_validation(exc, JobSpec), exc.errors(include_url=False)):
            canonical = join_path(user_loc(JobSpec, item["loc"]))
            source = self.sources.get(canonical)
            if source and source.field:
                out.append(FieldProblem(source.field, f"resolves to {problem}"))
            else:
                out.append(FieldProblem(f"<resolved>.{problem.path}", problem.message, problem.value))
        return out


def was_set(model: BaseModel, name: str) -> bool:
    return name in model.model_fields_set
