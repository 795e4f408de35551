"""What the dialects share: range checks worded for users, OpenRFT's extension block, the dataset
count that epoch-based step counts need, and the step arithmetic."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from openrft.spec.agents import AgentSpec
from openrft.spec.dialects.builder import SpecBuilder, was_set
from openrft.spec.dialects.interpolation import drop_blanks, resolve_interpolation
from openrft.spec.error_paths import user_loc
from openrft.spec.errors import FieldProblem, SpecError, outside, problems_from_validation
from openrft.spec.job import (
    MAX_AGE_TOLERANCE,
    MAX_EXAMPLES,
    MAX_LENGTH,
    MAX_LORA_RANK,
    MAX_MICRO_BATCH_TOKENS,
    MAX_NEW_TOKENS,
    MAX_PPO_MINI_BATCHES,
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_SAMPLES_PER_PROMPT,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_THREADS,
    DataSpec,
    ModelSpec,
    RolloutCorrectionSpec,
    SyncProbeSpec,
)
from openrft.spec.locations import is_remote, resolve_location
from openrft.spec.provenance import OPENRFT_DEFAULT
from openrft.spec.tools import ToolsSpec
from openrft.textlines import LinesUnreadable, text_lines

DatasetSizer = Callable[[str], int]
"""Number of examples in a dataset file, given its resolved location; raises DatasetUnreadable."""

MAX_SAMPLE_PROMPTS = 100_000

BASE_LEARNING_RATES: dict[str, float] = {"openrft-demo": 2e-4}
"""Base learning rates of known models (what Vertex/OpenAI multipliers scale); others get ModelSpec's."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def closed(low: float, high: float) -> AfterValidator:
    """A closed-range check worded ``is outside [low, high]`` (use as ``Annotated[float, closed(0, 1)]``)."""

    def check(value: Any) -> Any:
        if not low <= value <= high:
            raise ValueError(outside(low, high))
        return value

    return AfterValidator(check)


# OpenRFT's own settings -------------------------------------------------------------------------


class OpenRFTExtensions(Strict):
    """OpenRFT's own settings, in an ``openrft`` block beside any dialect's fields
    (documented in docs/hyperparameters.md). A setting the dialect itself has a field for is refused."""

    seed: Annotated[int, closed(0, MAX_SEED)] = 0
    lora_rank: Annotated[int, closed(1, MAX_LORA_RANK)] = 16
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    clip_ratio_low: float = Field(0.2, ge=0, le=1)
    max_grad_norm: Annotated[float, closed(0, 1e6)] = 1.0
    micro_batch_tokens: Annotated[int, closed(1, MAX_MICRO_BATCH_TOKENS)] = 8192
    activation_checkpointing: bool = False
    top_p: float = Field(1.0, gt=0, le=1)
    scale_advantages_by_std: bool = True
    on_reward_error: Literal["exclude", "zero", "fail"] = "exclude"
    eval_samples_per_prompt: Annotated[int, closed(1, MAX_SAMPLES_PER_PROMPT)] = 1
    eval_temperature: Annotated[float, closed(0, MAX_TEMPERATURE)] | None = None
    eval_max_examples: Annotated[int, closed(1, MAX_EXAMPLES)] | None = None
    eval_at_start: bool = True
    max_train_examples: Annotated[int, closed(1, MAX_EXAMPLES)] | None = None
    importance_weight_cap: float = Field(
        2.0, gt=1, le=1e9, description="dual-clip bound of the ratio (verl's clip_ratio_c)"
    )
    ppo_mini_batches: Annotated[int, closed(1, MAX_PPO_MINI_BATCHES)] = Field(
        1, description="optimizer updates per step (verl's ppo_mini_batch_size)"
    )
    loss_fn: str = Field("grpo", description="the policy loss by name (docs/algorithm.md, 'Losses by name')")
    loss_fn_config: dict[str, float] = Field(default_factory=dict, description="the loss's settings over its defaults")
    runtime: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    generator_base_url: str | list[str] | None = None
    generation_engine: Literal["auto", "local", "server", "vllm"] = "auto"
    rollout_correction: RolloutCorrectionSpec = RolloutCorrectionSpec()
    sync_probe: SyncProbeSpec = SyncProbeSpec()
    min_p: float = Field(0.0, ge=0, lt=1)
    ignore_eos: bool = False
    device: str = "auto"
    threads: Annotated[int, closed(1, MAX_THREADS)] | None = None
    processes: Annotated[int, closed(1, MAX_THREADS)] | None = None
    priority: Annotated[int, closed(-MAX_PRIORITY, MAX_PRIORITY)] = Field(
        0, description="the service's order among this tenant's queued jobs, higher first"
    )
    tensorboard: bool = True
    sample_prompts_per_step: Annotated[int, closed(0, MAX_SAMPLE_PROMPTS)] = 2
    eval_samples: bool = True
    samples_max_mb: float = Field(256.0, gt=0, le=1e6)
    base_learning_rate: float | None = Field(None, gt=0, le=1, description="what a learning-rate multiplier scales")
    max_length: Annotated[int, closed(2, MAX_LENGTH)] | None = Field(None, description="prompt + response tokens")
    max_new_tokens: Annotated[int, closed(1, MAX_NEW_TOKENS)] | None = None
    rollout_strategy: Literal["sync", "off_policy_async"] = "sync"
    age_tolerance: Annotated[int, closed(0, MAX_AGE_TOLERANCE)] | None = Field(
        None, description="off_policy_async only; default 2"
    )
    replicas: Annotated[int, closed(1, MAX_REPLICAS)] = 1
    learner_sharding: Literal["none", "fsdp"] = "none"
    learner_offload: Literal["none", "cpu"] = "none"
    generation_replicas: Annotated[int, closed(1, MAX_REPLICAS)] = 1
    lambda_map: dict[str, str] = Field(
        default_factory=dict,
        description="reward Lambda ARN -> a local handler (path.py:lambda_handler) or an http(s) URL; "
        "the key '*' maps the job's Lambda whatever its ARN (or a blank one)",
    )
    model_map: dict[str, str] = Field(
        default_factory=dict, description="a cloud-only model name or ARN -> a local path or Hugging Face id"
    )
    tools: ToolsSpec | None = None
    agent: AgentSpec | None = Field(None, description="your own agent drives the trajectories (docs/agents.md)")
    sandbox_isolation: Literal["strict", "weak"] = Field(
        "strict", description="the reward and tool sandbox: strict needs bubblewrap; weak is a plain subprocess"
    )


EXTENSION_TARGETS = {
    "seed": "training.seed",
    "lora_rank": "lora.rank",
    "lora_dropout": "lora.dropout",
    "clip_ratio_low": "algorithm.clip_ratio_low",
    "max_grad_norm": "optimizer.max_grad_norm",
    "micro_batch_tokens": "training.micro_batch_tokens",
    "activation_checkpointing": "training.activation_checkpointing",
    "top_p": "sampling.top_p",
    "scale_advantages_by_std": "algorithm.scale_advantages_by_std",
    "on_reward_error": "reward.on_error",
    "eval_samples_per_prompt": "evaluation.samples_per_prompt",
    "eval_temperature": "evaluation.temperature",
    "eval_max_examples": "evaluation.max_examples",
    "eval_at_start": "evaluation.at_start",
    "max_train_examples": "data.max_train_examples",
    "importance_weight_cap": "rollout.importance_weight_cap",
    "ppo_mini_batches": "algorithm.ppo_mini_batches",
    "loss_fn": "algorithm.loss_fn",
    "loss_fn_config": "algorithm.loss_fn_config",
    "runtime": "rollout.runtime",
    "ray_address": "rollout.ray_address",
    "generator_base_url": "rollout.generator_base_url",
    "generation_engine": "rollout.engine",
    "rollout_correction": "rollout.correction",
    "sync_probe": "rollout.sync_probe",
    "min_p": "sampling.min_p",
    "ignore_eos": "sampling.ignore_eos",
    "device": "runtime.device",
    "threads": "runtime.threads",
    "processes": "runtime.processes",
    "priority": "runtime.priority",
    "tensorboard": "tracking.tensorboard",
    "sample_prompts_per_step": "tracking.sample_prompts_per_step",
    "eval_samples": "tracking.eval_samples",
    "samples_max_mb": "tracking.samples_max_mb",
    "replicas": "rollout.replicas",
    "learner_sharding": "rollout.learner_sharding",
    "learner_offload": "rollout.learner_offload",
    "generation_replicas": "rollout.generation_replicas",
    "tools": "tools",
    "agent": "rollout.agent",
    "sandbox_isolation": "reward.sandbox.isolation",
}
"""Extension settings copied as they are; base_learning_rate, max_length and max_new_tokens the dialects
apply themselves (they combine with dialect fields), rollout_strategy and age_tolerance go together
through ``rollout_strategy``."""


def apply_extensions(b: SpecBuilder, ext: OpenRFTExtensions, covered: dict[str, str], dialect: str) -> None:
    """Copy the extension settings into the spec, refusing the ones ``covered`` by a field of the dialect."""
    b.model_map = dict(ext.model_map)
    for name, field in covered.items():
        if was_set(ext, name):
            b.problem(f"openrft.{name}", f"is set by {field} in a {dialect} job; set it there", getattr(ext, name))
    for name, path in EXTENSION_TARGETS.items():
        if name not in covered:
            b.take(path, ext, name, f"openrft.{name}", note=None if was_set(ext, name) else OPENRFT_DEFAULT)
    if "rollout_strategy" not in covered:
        rollout_strategy(b, ext, "rollout_strategy", "age_tolerance", "openrft")


def rollout_strategy(b: SpecBuilder, model: BaseModel, type_name: str, tolerance_name: str, prefix: str) -> None:
    """``rollout.strategy`` and ``rollout.age_tolerance``: 0 for sync (anything else is a problem),
    Nova's documented 2 for off_policy_async unless given."""
    strategy, tolerance = getattr(model, type_name), getattr(model, tolerance_name)
    type_field, tolerance_field = f"{prefix}.{type_name}", f"{prefix}.{tolerance_name}"
    b.take("rollout.strategy", model, type_name, type_field)
    if strategy == "sync":
        if tolerance not in (None, 0):
            b.problem(tolerance_field, f"needs {type_field}: off_policy_async (sync rollouts have age 0)", tolerance)
        b.derived("rollout.age_tolerance", 0, "sync rollouts are never stale", type_field)
    elif tolerance is None:
        b.default("rollout.age_tolerance", 2, tolerance_field, "Nova's documented value for off_policy_async")
    else:
        b.user("rollout.age_tolerance", tolerance, tolerance_field)


MLFLOW_SETTINGS = ("mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_run_name")
"""Nova's ``run.mlflow_*`` names; Vertex ``labels`` and OpenAI ``metadata`` carry them under the same keys."""


def tracking_from_metadata(b: SpecBuilder, values: dict[str, str], field: str) -> None:
    """MLflow settings given as key-value metadata (``labels.mlflow_tracking_uri``) -> ``tracking.*``."""
    for name in MLFLOW_SETTINGS:
        if name in values:
            b.user(f"tracking.{name}", values[name], f"{field}.{name}")


def base_learning_rate(b: SpecBuilder, ext: OpenRFTExtensions, service_rule: str | None = None) -> float:
    """``model.base_learning_rate``: the extension's, else the known rate of the model that trains, else
    ModelSpec's default. The model that trains is the job's model after ``--map-model``/``openrft.model_map``:
    a mapping substitutes the name and nothing else, so a mapped job resolves as the same job written with
    the local model. ``service_rule`` says what the service's own rule for its cloud model would be."""
    if ext.base_learning_rate is not None:
        return b.user("model.base_learning_rate", ext.base_learning_rate, "openrft.base_learning_rate")
    model = b.values.get("model.name_or_path", "")
    whose = f"the base rate of {model}"
    if b.mapped_model is not None:
        whose += f", the model the job's {b.mapped_model!r} is mapped to"
        if service_rule:
            whose += f" ({service_rule})"
    if model in BASE_LEARNING_RATES:
        rate, note = BASE_LEARNING_RATES[model], whose
    else:
        rate = ModelSpec.model_fields["base_learning_rate"].default
        note = f"OpenRFT's base rate for models without a known one ({model or 'no model'})"
        if b.mapped_model is not None:
            note += f", applied to the model the job's {b.mapped_model!r} is mapped to"
    return b.default("model.base_learning_rate", rate, None, f"{note}; openrft.base_learning_rate sets another")


# Dataset sizes ----------------------------------------------------------------------------------


class DatasetUnreadable(Exception):
    """A dataset that cannot be read where the job is resolved (an object-store URI, a missing file)."""


def run_locations(b: SpecBuilder, run: Any, base_dir: Path, missing: str) -> None:
    """A Nova-shaped ``run`` block's datasets and output (``data_s3_path``, ``validation_data_s3_path``,
    ``output_s3_path``); ``missing`` says why a blank training dataset is required and how to give it."""
    if run.data_s3_path:
        b.user("data.train", resolve_location(run.data_s3_path, base_dir), "run.data_s3_path")
    else:
        b.problem("run.data_s3_path", missing, remedy="write run.data_s3_path")
    if run.validation_data_s3_path:
        b.user(
            "data.validation", resolve_location(run.validation_data_s3_path, base_dir), "run.validation_data_s3_path"
        )
    if run.output_s3_path:
        b.user("output_dir", resolve_location(run.output_s3_path, base_dir), "run.output_s3_path")


def count_examples(location: str) -> int:
    """Non-blank lines of a local JSONL file: its number of examples."""
    if is_remote(location):
        raise DatasetUnreadable("is not readable here (only local files and file:// URIs are)")
    path = Path(location)
    if not path.is_file():
        raise DatasetUnreadable("does not exist or is not a file")
    try:
        return sum(1 for line in text_lines(path.read_bytes()) if line.strip())
    except LinesUnreadable as exc:
        raise DatasetUnreadable(f"line {exc.line}: {exc.reason}" if exc.line else exc.reason) from None
    except OSError as exc:
        raise DatasetUnreadable(f"cannot be read ({exc.strerror})") from None


def training_prompts(
    b: SpecBuilder,
    sizer: DatasetSizer,
    train_field: str,
    needed_for: str | None,
    alternative: str = "",
    validation_field: str | None = None,
) -> int | None:
    """Prompts the job trains on (after holding out a validation part): counted from the training file.

    Reads the ``data.*`` values already set on ``b`` and enforces their example limits. When the file
    cannot be read, records a problem at ``train_field`` if ``needed_for`` names what needs the count
    (else the count is optional) and returns None.
    """
    if "data.train" not in b.values:
        return None  # no training dataset: already a problem at its field
    data = DataSpec(**{path[5:]: v for path, v in b.values.items() if path.startswith("data.")})
    try:
        total = sizer(data.train)
    except DatasetUnreadable as exc:
        if needed_for is None:
            return None
        if not is_remote(data.train) and Path(data.train).is_file():  # there, but not readable as text
            b.problem(train_field, f"{exc}, and {needed_for} needs its number of prompts", data.train)
            return None
        hint = f", {alternative}" if alternative else ""
        b.problem(
            train_field,
            f"{exc}, and {needed_for} needs its number of prompts: give a local path (--map {data.train}=PATH){hint}",
            data.train,
        )
        return None
    if data.train_examples_limit and total > data.train_examples_limit:
        b.problem(
            train_field, f"holds {total:,} examples; at most {data.train_examples_limit:,} are allowed", data.train
        )
        return None
    if data.validation and data.validation_examples_limit and validation_field:
        try:
            validation = sizer(data.validation)
        except DatasetUnreadable:
            validation = 0  # the engine reports it when it loads the file
        if validation > data.validation_examples_limit:
            b.problem(
                validation_field,
                f"holds {validation:,} examples; at most {data.validation_examples_limit:,} are allowed",
                data.validation,
            )
    prompts = data.train_prompts(total)
    if prompts < 1:
        held = data.held_out(total)
        b.problem(
            train_field,
            f"holds {total} example(s); none is left to train on after holding out {held} for validation",
            data.train,
        )
        return None
    return prompts


# Step arithmetic --------------------------------------------------------------------------------


def exact(value: float) -> Fraction:
    """A user's decimal number as an exact fraction (0.704 -> 88/125), so ceilings do not catch float noise."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def steps_for_epochs(epochs: Fraction, prompts: int, prompts_per_step: int) -> int:
    """``ceil(epochs * prompts / prompts_per_step)``, at least 1."""
    return max(1, math.ceil(epochs * prompts / prompts_per_step))


def vertex_default_epochs(prompts_per_step: int, prompts: int) -> Fraction:
    """Vertex's default ``epochCount``: ``min(110 * batchSize / promptsInDataset, 10)``."""
    return min(Fraction(110 * prompts_per_step, prompts), Fraction(10))


def steps_per_epoch(prompts: int, prompts_per_step: int) -> int:
    return math.ceil(prompts / prompts_per_step)


def fmt(value: Fraction | float) -> str:
    """A number for explanations: whole numbers without decimals, others to 4 significant digits."""
    number = float(value)
    return f"{number:g}" if number == int(number) else f"{number:.4g}"


M = TypeVar("M", bound=BaseModel)


def build_reward(b: SpecBuilder, model: type[M], field: str, **values: Any) -> M | None:
    """A reward config ``model(**values)`` built from user input, the value at the user's ``field``; its
    validation errors are recorded at ``field`` (followed by the path inside the value)."""
    try:
        return model(**values)
    except ValidationError as exc:
        b.problems.extend(problems_from_validation(exc, model, field, skip=1))
        return None


def read_recipe(model: type[M], raw: Any, source: str | None) -> tuple[M, list[FieldProblem]]:
    """A recipe read as its launchers read it (OmegaConf ``${...}`` resolved, blank values unset) and validated,
    every problem kept for the resolver to report at once; unreadable even so: the problems as a ``SpecError``."""
    resolved, problems = resolve_interpolation(raw)
    recipe, more = validate_all(model, drop_blanks(resolved, model))
    problems += more
    if recipe is None:
        raise SpecError(problems, source)
    return recipe, problems


def validate_all(model: type[M], raw: dict[str, Any]) -> tuple[M | None, list[FieldProblem]]:
    """Validate ``raw``; on errors, also validate it without the offending values (their defaults instead),
    so that the resolver can still check the rest and every problem of a request is reported at once.
    Returns None for the model when the request cannot be read even so (a required field is missing)."""
    try:
        return model.model_validate(raw), []
    except ValidationError as exc:
        problems = problems_from_validation(exc, model)
        pruned = copy.deepcopy(raw)
        for item in exc.errors(include_url=False):
            if item["type"] == "missing" or not _drop(pruned, user_loc(model, item["loc"])):
                return None, problems
        try:
            return model.model_validate(pruned), problems
        except ValidationError:
            return None, problems


def _drop(data: Any, loc: list[Any]) -> bool:
    """Delete the value at ``loc`` (a mapping key); False when there is nothing removable there."""
    for part in loc[:-1]:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(data, dict) and loc and loc[-1] in data:
        del data[loc[-1]]
        return True
    return False
