"""An OpenAI fine-tuning job body with ``method.type: reinforcement`` (docs/contracts.md §3) -> JobSpec.

Every hyperparameter may be ``"auto"``; what each resolves to is documented in
docs/hyperparameters.md (the Vertex rules where OpenAI publishes none, so that the dialects agree).
``training_file``/``validation_file`` are file ids, resolved by the caller's ``file_resolver`` (the job
service's file store), or, without one, local paths and ``file://`` URIs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, field_validator

from openrft.errors import OpenRFTError
from openrft.spec.dialects.builder import SpecBuilder
from openrft.spec.dialects.common import (
    DatasetSizer,
    OpenRFTExtensions,
    Strict,
    apply_extensions,
    base_learning_rate,
    build_reward,
    count_examples,
    exact,
    fmt,
    steps_for_epochs,
    steps_per_epoch,
    tracking_from_metadata,
    training_prompts,
    validate_all,
    vertex_default_epochs,
)
from openrft.spec.dialects.registry import Dialect, DocumentFields, register
from openrft.spec.errors import FieldProblem, SpecError, outside
from openrft.spec.job import MAX_SAMPLES_PER_PROMPT, MAX_STEPS
from openrft.spec.locations import resolve_location
from openrft.spec.provenance import Resolution
from openrft.spec.rewards import OpenAIGraderReward
from openrft.spec.tools import MAX_TURNS
from openrft.spec.urls import HttpUrl

FileResolver = Callable[[str], str]
FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]+$")
AUTO_BATCH_SIZE = 32  # Vertex's default batchSize
BASE_SAMPLES_PER_PROMPT = 16  # Vertex's default samplesPerPrompt, scaled by compute_multiplier
MAX_NEW_TOKENS = 32_768  # Vertex's maxOutputTokens default; OpenAI exposes none
PROMPT_TOKENS = 8_192
REASONING = {"default": "medium", "low": "low", "medium": "medium", "high": "high"}
H = "method.reinforcement.hyperparameters"
MAX_LR_MULTIPLIER = 10.0  # OpenAI publishes no bound; ten times the base rate is already far past stable


def auto_or(kind: type, low: float, high: float | None = None, low_exclusive: bool = False) -> PlainValidator:
    """A number in a range, or ``"auto"``; errors worded for users (``is outside [1, 256]``)."""
    noun = "an integer" if kind is int else "a number"

    def check(value: Any) -> Any:
        if value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
            raise ValueError(f"must be {noun} or 'auto'")
        value = kind(value)
        if high is not None and not low <= value <= high:
            raise ValueError(outside(low, high))
        if low_exclusive and value <= low:
            raise ValueError(f"must be > {low:g}")
        if not low_exclusive and value < low:
            raise ValueError(f"must be >= {low:g}")
        return value

    return PlainValidator(check)


class OpenAIHyperparameters(Strict):
    n_epochs: Annotated[Any, auto_or(int, 1, 50)] = "auto"
    batch_size: Annotated[Any, auto_or(int, 1, 256)] = "auto"
    learning_rate_multiplier: Annotated[Any, auto_or(float, 0, MAX_LR_MULTIPLIER, low_exclusive=True)] = "auto"
    eval_interval: Annotated[Any, auto_or(int, 1, MAX_STEPS)] = "auto"
    eval_samples: Annotated[Any, auto_or(int, 1, MAX_SAMPLES_PER_PROMPT)] = "auto"
    compute_multiplier: Annotated[Any, auto_or(float, 0.00001, 10)] = "auto"
    reasoning_effort: Literal["default", "low", "medium", "high"] = "default"


class AzureTool(Strict):
    """One tool server of Azure OpenAI's agentic RFT (docs/tools.md, "Azure's agentic tools")."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    server_url: HttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class OpenAIReinforcement(Strict):
    grader: dict[str, Any]
    hyperparameters: OpenAIHyperparameters = OpenAIHyperparameters()
    response_format: dict[str, Any] | None = None
    tools: list[AzureTool] | None = Field(None, min_length=1, max_length=128)  # Azure OpenAI's agentic RFT
    max_episode_steps: int | None = Field(None, ge=1, le=MAX_TURNS)


class LegacyHyperparameters(Strict):
    """The job's top-level ``hyperparameters`` (deprecated by OpenAI in favour of the method's)."""

    n_epochs: Annotated[Any, auto_or(int, 1, 50)] = "auto"
    batch_size: Annotated[Any, auto_or(int, 1, 256)] = "auto"
    learning_rate_multiplier: Annotated[Any, auto_or(float, 0, low_exclusive=True)] = "auto"


class OpenAIMethod(Strict):
    type: Literal["supervised", "dpo", "reinforcement"]
    reinforcement: OpenAIReinforcement | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class OpenAIJob(Strict):
    model: str
    training_file: str
    validation_file: str | None = None
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    suffix: str | None = Field(None, min_length=1, max_length=64)
    metadata: dict[str, str] | None = None
    method: OpenAIMethod
    hyperparameters: LegacyHyperparameters | None = None
    integrations: list[Any] | None = None
    trainingType: str | None = None  # Azure OpenAI's deployment type of the training job
    openrft: OpenRFTExtensions = OpenRFTExtensions()

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > 16:
            raise ValueError(f"has {len(value)} keys; at most 16 are allowed")
        for key, text in value.items():
            if len(key) > 64 or len(text) > 512:
                raise ValueError(f"key {key!r}: keys are at most 64 characters and values at most 512")
        return value


def parse_job(
    raw: Any,
    base_dir: Path | None = None,
    source: str | None = None,
    file_resolver: FileResolver | None = None,
    dataset_size: DatasetSizer = count_examples,
) -> Resolution:
    """Validate an OpenAI job body (already loaded from JSON) and resolve it."""
    if not isinstance(raw, dict):
        raise SpecError(
            [FieldProblem("<root>", "an OpenAI job is a JSON object with model, training_file and method")], source
        )
    job, problems = validate_all(OpenAIJob, raw)
    if job is None:
        raise SpecError(problems, source)
    if job.method.type != "reinforcement":
        problems.append(
            FieldProblem(
                "method.type",
                "is not reinforcement fine-tuning: OpenRFT runs jobs with method.type 'reinforcement' "
                "(a grader scores sampled answers); supervised and DPO jobs need a supervised trainer",
                job.method.type,
            )
        )
        raise SpecError(problems, source)
    if job.method.reinforcement is None:
        raise SpecError([*problems, FieldProblem("method.reinforcement", "is required with method.type reinforcement")])
    return _resolve(job, base_dir or Path.cwd(), source, file_resolver, dataset_size, problems)


def _merge_legacy(b: SpecBuilder, job: OpenAIJob) -> OpenAIHyperparameters:
    """The method's hyperparameters, with the deprecated top-level ones filling what it leaves at auto."""
    assert job.method.reinforcement is not None
    hp = job.method.reinforcement.hyperparameters
    legacy = job.hyperparameters
    if legacy is None:
        return hp
    taken = {
        name: getattr(legacy, name)
        for name in legacy.model_fields_set
        if getattr(hp, name) == "auto" and getattr(legacy, name) != "auto"
    }
    b.warn(
        "hyperparameters",
        "is deprecated by OpenAI for method.reinforcement.hyperparameters"
        + (f"; used for {', '.join(sorted(taken))}" if taken else "; ignored (the method's values are used)"),
    )
    return OpenAIHyperparameters(**{**hp.model_dump(exclude_unset=True), **taken}) if taken else hp


def resolve_file(b: SpecBuilder, value: str, field: str, base_dir: Path, resolver: FileResolver | None) -> str | None:
    """A file id or path -> a location; with a resolver every value goes through it (it may refuse paths)."""
    if resolver is not None:
        try:
            return resolve_location(resolver(value), base_dir)
        except (LookupError, ValueError, OpenRFTError) as exc:
            b.problem(field, f"cannot be resolved: {exc}", value)
            return None
    if FILE_ID.match(value) and not (base_dir / value).exists():
        b.problem(
            field,
            f"is an OpenAI file id, which only the OpenRFT service's file store resolves: map it to a local "
            f"file (--map {value}=PATH), or submit the job to the service",
            value,
            remedy=f"--map {value}=PATH",
        )
        return None
    return resolve_location(value, base_dir)


def _resolve(
    job: OpenAIJob,
    base_dir: Path,
    source: str | None,
    resolver: FileResolver | None,
    sizer: DatasetSizer,
    problems: list[FieldProblem],
) -> Resolution:
    assert job.method.reinforcement is not None
    ext = job.openrft
    b = SpecBuilder(problems)
    hp = _merge_legacy(b, job)
    b.derived("dialect", "openai", "an OpenAI fine-tuning job (method.type: reinforcement)")
    for other in ("supervised", "dpo"):
        if getattr(job.method, other) is not None:
            b.warn(f"method.{other}", "is ignored: method.type is reinforcement")
    if job.method.reinforcement.response_format is not None:
        b.warn(
            "method.reinforcement.response_format",
            "does not constrain OpenRFT's sampling (open models generate free text): graders still read the "
            "output parsed as JSON through sample.output_json, and the prompt should ask for the format",
        )
    apply_extensions(b, ext, {"seed": "seed", "eval_samples_per_prompt": f"{H}.eval_samples"}, "OpenAI")
    _agentic_tools(b, job.method.reinforcement, ext)
    if job.suffix:
        b.user("name", job.suffix, "suffix")
    if job.metadata:
        b.user("metadata", dict(job.metadata), "metadata")
        tracking_from_metadata(b, job.metadata, "metadata")
    if job.seed is not None:
        b.user("training.seed", job.seed, "seed")
    else:
        b.default("training.seed", ext.seed, "seed", "OpenRFT's fixed seed (OpenAI would draw one)")
    if job.trainingType is not None:
        b.warn("trainingType", "is Azure OpenAI's training tier; not used by OpenRFT", job.trainingType)
    if job.integrations:
        b.warn(
            "integrations",
            "are not supported by OpenRFT; ignored (metrics go to metrics.jsonl and TensorBoard, "
            "and to MLflow with metadata.mlflow_tracking_uri)",
        )

    b.model(job.model, base_dir, "model")
    base_rate = base_learning_rate(b, ext, f"OpenAI's base rate for {job.model} is not published")
    train = resolve_file(b, job.training_file, "training_file", base_dir, resolver)
    if train is not None:
        b.user("data.train", train, "training_file")
    if job.validation_file is not None:
        validation = resolve_file(b, job.validation_file, "validation_file", base_dir, resolver)
        if validation is not None:
            b.user("data.validation", validation, "validation_file")

    _sampling(b, hp, ext)
    multiplier = 1.0 if hp.learning_rate_multiplier == "auto" else hp.learning_rate_multiplier
    b.derived(
        "optimizer.lr",
        multiplier * base_rate,
        f"learning_rate_multiplier {fmt(multiplier)}"
        f"{' (auto)' if hp.learning_rate_multiplier == 'auto' else ''} × base rate {base_rate:g}",
        f"{H}.learning_rate_multiplier",
    )
    rank = ext.lora_rank
    b.derived("lora.alpha", float(2 * rank), "2 × rank, as for Vertex adapters", "openrft.lora_rank")

    prompts = _steps(b, hp, sizer) if train is not None else None
    grader = job.method.reinforcement.grader  # type: ignore[union-attr]
    if grader.get("type") == "lambda":  # Bedrock's OpenAI-compatible API: a reward Lambda
        _lambda_grader(b, grader, ext, base_dir)
        return b.build(source, prompts)
    config = build_reward(b, OpenAIGraderReward, "method.reinforcement.grader", grader=grader)
    if config is not None:
        b.user("reward.function", config, "method.reinforcement.grader")
    return b.build(source, prompts)


AZURE_TOOL_REMOTE = {"timeout_s": 600.0, "max_retries": 3}
"""Azure's tool-server terms: an answer within 10 minutes, a 5xx retried at most 3 times."""


def _agentic_tools(b: SpecBuilder, method: OpenAIReinforcement, ext: OpenRFTExtensions) -> None:
    """Azure's ``tools: [{name, server_url, headers}]`` and ``max_episode_steps`` onto the tool loop: each a
    ``tools.functions`` entry called with Azure's contract (``function_call``), the steps its ``max_turns``."""
    field = "method.reinforcement"
    if method.tools is None:
        if method.max_episode_steps is not None:
            b.warn(f"{field}.max_episode_steps", "has no effect without method.reinforcement.tools")
        return
    tools = ext.tools.model_dump() if ext.tools is not None else {}
    functions = tools.setdefault("functions", {})
    for i, tool in enumerate(method.tools):
        if tool.name in functions:
            earlier = tool.name in {t.name for t in method.tools[:i]}
            where = "an earlier entry" if earlier else "openrft.tools.functions"
            message = f"names a tool that {where} also defines; name each tool once"
            b.problem(f"{field}.tools[{i}].name", message, tool.name)
            continue
        functions[tool.name] = {
            "type": "http",
            "url": tool.server_url,
            "contract": "function_call",
            "headers": dict(tool.headers),
            "remote": dict(AZURE_TOOL_REMOTE),
        }
    if method.max_episode_steps is not None:
        if ext.tools is not None and "max_turns" in ext.tools.model_fields_set:
            b.problem("openrft.tools.max_turns", f"is set by {field}.max_episode_steps in this job; set it there")
        tools["max_turns"] = method.max_episode_steps
    b.user("tools", tools, f"{field}.tools")


def tool_fields(document: Any) -> dict[str, str]:
    """Spec paths -> the fields of ``document`` that set them, for Azure's tool servers (a list entry each)."""
    method = document.get("method") if isinstance(document, dict) else None
    tools = ((method or {}).get("reinforcement") or {}).get("tools") if isinstance(method, dict) else None
    if not isinstance(tools, list):
        return {}
    return {
        f"tools.functions.{tool['name']}.url": f"method.reinforcement.tools[{i}].server_url"
        for i, tool in enumerate(tools)
        if isinstance(tool, dict) and isinstance(tool.get("name"), str)
    }


def _lambda_grader(b: SpecBuilder, grader: dict[str, Any], ext: OpenRFTExtensions, base_dir: Path) -> None:
    """``{"type": "lambda", "lambda": {"function": ARN}}`` (Bedrock's fine-tuning jobs for open-weight models):
    the Nova Lambda contract, the ARN mapped like a Nova recipe's (``openrft.lambda_map``, ``--map-lambda``)."""
    from openrft.spec.dialects.lambdas import lambda_reward

    field = "method.reinforcement.grader.lambda.function"
    body = grader.get("lambda")
    arn = body.get("function") if isinstance(body, dict) else None
    if arn is not None and not isinstance(arn, str):
        b.problem(field, "must be a Lambda ARN (a string)", arn)
        return
    extra = sorted(set(grader) - {"type", "lambda", "name"}) + sorted(set(body or {}) - {"function"})
    for key in extra:
        b.warn(f"method.reinforcement.grader.{key}", "is not used by OpenRFT")
    lambda_reward(b, arn or None, field, ext.lambda_map, base_dir)


def _sampling(b: SpecBuilder, hp: OpenAIHyperparameters, ext: OpenRFTExtensions) -> None:
    if hp.compute_multiplier == "auto":
        b.default(
            "sampling.samples_per_prompt",
            BASE_SAMPLES_PER_PROMPT,
            f"{H}.compute_multiplier",
            f"auto: {BASE_SAMPLES_PER_PROMPT} samples per prompt",
        )
    else:
        samples = max(2, round(BASE_SAMPLES_PER_PROMPT * hp.compute_multiplier))
        b.derived(
            "sampling.samples_per_prompt",
            samples,
            f"max(2, round({BASE_SAMPLES_PER_PROMPT} × compute_multiplier {fmt(hp.compute_multiplier)}))",
            f"{H}.compute_multiplier",
        )
    if ext.max_new_tokens is not None:
        b.user("sampling.max_new_tokens", ext.max_new_tokens, "openrft.max_new_tokens")
    else:
        b.default("sampling.max_new_tokens", MAX_NEW_TOKENS, None, "OpenAI sets none; Vertex's default")
    tokens = b.values["sampling.max_new_tokens"]
    if ext.max_length is not None:
        b.user("sampling.max_length", ext.max_length, "openrft.max_length")
    else:
        b.derived("sampling.max_length", tokens + PROMPT_TOKENS, f"max_new_tokens + {PROMPT_TOKENS:,} prompt tokens")
    b.take("sampling.reasoning_effort", hp, "reasoning_effort", f"{H}.reasoning_effort", REASONING[hp.reasoning_effort])
    if hp.eval_samples == "auto":
        b.default("evaluation.samples_per_prompt", 1, f"{H}.eval_samples", "auto: one sample per validation prompt")
    else:
        b.user("evaluation.samples_per_prompt", hp.eval_samples, f"{H}.eval_samples")


def _steps(b: SpecBuilder, hp: OpenAIHyperparameters, sizer: DatasetSizer) -> int | None:
    if hp.batch_size == "auto":
        batch = b.default(
            "training.prompts_per_step", AUTO_BATCH_SIZE, f"{H}.batch_size", f"auto: {AUTO_BATCH_SIZE} prompts per step"
        )
    else:
        batch = b.user("training.prompts_per_step", hp.batch_size, f"{H}.batch_size")
    prompts = training_prompts(b, sizer, "training_file", "n_epochs")
    if prompts is None:
        return None
    if hp.n_epochs == "auto":
        epochs: Fraction = vertex_default_epochs(batch, prompts)
        b.derived(
            "training.epochs",
            float(epochs),
            f"auto: min(110 × batch_size / prompts, 10) = min(110 × {batch} / {prompts}, 10)",
            f"{H}.n_epochs",
        )
    else:
        epochs = exact(hp.n_epochs)
        b.user("training.epochs", float(hp.n_epochs), f"{H}.n_epochs")
    steps = steps_for_epochs(epochs, prompts, batch)
    b.derived(
        "training.total_steps",
        steps,
        f"ceil(n_epochs × prompts / batch_size) = ceil({fmt(epochs)} × {prompts} / {batch}) = {steps}",
        f"{H}.n_epochs",
    )
    if hp.eval_interval == "auto":
        interval = min(steps_per_epoch(prompts, batch), steps)
        b.derived(
            "evaluation.interval",
            interval,
            f"auto: once per epoch, ceil(prompts / batch_size) = "
            f"ceil({prompts} / {batch}), at most the run's {steps} steps",
            f"{H}.eval_interval",
        )
    else:
        interval = b.user("evaluation.interval", hp.eval_interval, f"{H}.eval_interval")
    b.derived(
        "checkpoint.interval",
        interval,
        "at every evaluation: OpenAI keeps the best checkpoints by validation reward",
        f"{H}.eval_interval",
    )
    return prompts


register(
    Dialect(
        "openai",
        lambda document: isinstance(document, dict) and ("method" in document or "training_file" in document),
        parse_job,
        DocumentFields(
            train="training_file",
            validation="validation_file",
            model="model",
            reward="method.reinforcement.grader",
            output="output_dir",
            tracking="metadata",
            replicas="openrft.replicas",
            user_metadata="metadata",
            suffix="suffix",
            resolves_file_ids=True,
            entry_fields=tool_fields,
        ),
        order=30,
    )
)
