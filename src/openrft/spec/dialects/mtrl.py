"""Amazon Nova's multi-turn (agentic) RFT recipe, "MTRL" (YAML) -> JobSpec.

The recipe as SageMaker HyperPod publishes it (``recipes_collection/recipes/fine-tuning/nova/nova_2_0/
nova_lite/MTRL/mtrl_nova_lite_2_0_lora.yaml``, recipe_version 1.0.25 and 1.0.26): ``run``, ``batch``,
``rl``, ``sampling_params``, ``val_sampling_params``, ``val_metrics_config``, ``schedule``, ``model``,
``rollout``, ``async_config``, ``data_filter``; the ranges are those of the launcher's template parameters
(``launcher/recipe_templatization/mtrl/mtrl_recipe_template_parameters.json``), whose defaults apply to a
field the recipe leaves out. The recipe names no dataset, output or reward (the launcher passes them as the
job's inputs): OpenRFT reads them in ``run`` as in Nova's other recipes (``data_s3_path``,
``validation_data_s3_path``, ``output_s3_path``, ``reward_lambda_arn``), and the episodes' tools in the
``openrft`` block. A field OpenRFT cannot honour is refused by name (docs/hyperparameters.md, "Amazon Nova
MTRL recipe").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from openrft.spec.dialects.builder import SpecBuilder, was_set
from openrft.spec.dialects.common import (
    MLFLOW_SETTINGS,
    DatasetSizer,
    OpenRFTExtensions,
    Strict,
    apply_extensions,
    base_learning_rate,
    closed,
    count_examples,
    exact,
    read_recipe,
    run_locations,
    steps_for_epochs,
    training_prompts,
)
from openrft.spec.dialects.lambdas import ANY_LAMBDA, lambda_reward
from openrft.spec.errors import FieldProblem
from openrft.spec.provenance import Resolution

SECTIONS = (
    "batch",
    "rl",
    "sampling_params",
    "val_sampling_params",
    "val_metrics_config",
    "schedule",
    "model",
    "rollout",
    "async_config",
    "data_filter",
)
ADVANTAGE_METHODS = (
    "group_based",
    "monte_carlo",
    "group_based_per_turn",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "opo",
    "grpo_passk",
    "gpg",
)
"""The launcher's values of ``rl.advantage_method``; OpenRFT computes ``group_based`` only."""

COVERED = {
    "lora_rank": "model.lora_rank",
    "top_p": "sampling_params.top_p",
    "max_grad_norm": "model.grad_clip_norm",
    "scale_advantages_by_std": "rl.advantage_normalization",
    "eval_samples_per_prompt": "batch.val_group_size",
    "eval_temperature": "val_sampling_params.temperature",
    "eval_max_examples": "batch.val_batch_size",
    "eval_at_start": "schedule.val_at_start",
    "rollout_strategy": "async_config.max_steps_off_policy",
    "age_tolerance": "async_config.max_steps_off_policy",
    "max_length": "model.max_sequence_length",
    "max_new_tokens": "sampling_params.max_tokens",
    "base_learning_rate": "model.learning_rate",
    "loss_fn": "rl.loss_fn",
    "loss_fn_config": "rl.clip_low_threshold",
}
"""``openrft`` settings an MTRL recipe has its own field for (refused in the block, naming the field)."""


def is_mtrl_recipe(document: Any) -> bool:
    """An MTRL recipe: ``run.model_type: mtrl``, or MTRL's sections without Nova RFT's ``training_config``."""
    if not isinstance(document, dict) or "training_config" in document:
        return False
    run = document.get("run")
    if isinstance(run, dict) and run.get("model_type") == "mtrl":
        return True
    return "run" in document and any(name in document for name in ("batch", "rl", "schedule"))


class MtrlRun(Strict):
    name: str = "mtrl-run"
    model_type: Literal["mtrl"] = "mtrl"
    data_s3_path: str | None = None
    validation_data_s3_path: str | None = None
    output_s3_path: str | None = None
    reward_lambda_arn: str | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_experiment_name: str | None = None
    mlflow_run_name: str | None = None


class MtrlBatch(Strict):
    training_batch_size: Literal[8, 16, 32, 64] = 32
    group_size: Annotated[int, closed(2, 32)] = 4
    val_batch_size: int | None = Field(None, ge=1)
    val_group_size: Annotated[int, closed(1, 32)] = 1
    val_random_sample: bool = False


class MtrlRl(Strict):
    advantage_method: Literal[ADVANTAGE_METHODS] = "group_based"  # type: ignore[valid-type]
    advantage_normalization: bool = True
    gamma: Annotated[float, closed(0, 1)] = 1.0
    loss_fn: Literal["importance_sampling", "ppo", "cispo"] = "ppo"
    clip_low_threshold: Annotated[float, closed(0, 1)] = 0.8
    clip_high_threshold: Annotated[float, closed(1, 10)] = 1.2


class MtrlSampling(Strict):
    temperature: Annotated[float, closed(0, 2)] = 0.7
    top_p: Annotated[float, closed(0, 1)] = 0.95
    max_tokens: Annotated[int, closed(512, 8192)] = 4096


class MtrlValSampling(Strict):
    temperature: Annotated[float, closed(0, 2)] = 0.0
    top_p: Annotated[float, closed(0, 1)] | None = None
    max_tokens: Annotated[int, closed(512, 8192)] | None = None


class MtrlValMetrics(Strict):
    pass_k_values: list[Annotated[int, closed(1, 1024)]] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    success_threshold: float = 1.0


class MtrlSchedule(Strict):
    epochs: Annotated[int, closed(1, 30)] = 1
    max_steps: Annotated[int, closed(1, 1000)] = 50
    save_every: Annotated[int, closed(0, 100)] = 5
    val_every: Annotated[int, closed(0, 100)] = 5
    val_at_start: bool = True


class MtrlModel(Strict):
    model_name: str | None = None  # required: a problem of the resolver, so the others are reported too
    max_sequence_length: int = Field(32768, ge=2)
    lora_rank: Annotated[int, closed(16, 64)] = 32
    lora_alpha: Annotated[int, closed(16, 128)] = 64
    learning_rate: float = Field(1e-5, gt=0, le=1e-2)
    adam_beta1: Annotated[float, closed(0, 0.999999)] = 0.9
    adam_beta2: Annotated[float, closed(0, 0.999999)] = 0.95
    adam_eps: Annotated[float, closed(1e-16, 1e-2)] = 1e-12
    weight_decay: Annotated[float, closed(0, 1)] = 0.0
    grad_clip_norm: Annotated[float, closed(0, 100)] = 0.0
    lora_plus_lr_ratio: Annotated[float, closed(1, 100)] = 64.0


class MtrlRollout(Strict):
    max_concurrency: Annotated[int, closed(32, 96)] = 96
    timeout: Annotated[float, closed(300, 86400)] = 600.0
    max_retries: Annotated[int, closed(1, 10)] = 3
    rollout_tps: float | None = Field(None, gt=0)


class MtrlAsync(Strict):
    max_steps_off_policy: Annotated[int, closed(0, 10)] = 3


class MtrlDataFilter(Strict):
    max_filter_rate: Annotated[float, closed(0, 1)] = 0.5
    max_repeated_tokens: int = Field(30, ge=1)
    max_ngram_size: Annotated[int, closed(1, 1024)] = 30


class MtrlRecipe(Strict):
    display_name: str | None = None
    recipe_version: str | None = None
    run: MtrlRun
    batch: MtrlBatch = MtrlBatch()
    rl: MtrlRl = MtrlRl()
    sampling_params: MtrlSampling = MtrlSampling()
    val_sampling_params: MtrlValSampling = MtrlValSampling()
    val_metrics_config: MtrlValMetrics = MtrlValMetrics()
    schedule: MtrlSchedule = MtrlSchedule()
    model: MtrlModel = MtrlModel()
    rollout: MtrlRollout = MtrlRollout()
    async_config: MtrlAsync = MtrlAsync()
    data_filter: MtrlDataFilter | None = None
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def parse_mtrl(
    raw: Any, base_dir: Path | None = None, source: str | None = None, dataset_size: DatasetSizer = count_examples
) -> Resolution:
    """Validate an MTRL recipe (already loaded from YAML, OmegaConf ``${...}`` resolved as its launcher does)
    and resolve it, every problem reported at once."""
    recipe, problems = read_recipe(MtrlRecipe, raw, source)
    return _resolve(recipe, base_dir or Path.cwd(), source, dataset_size, problems)


def _resolve(
    recipe: MtrlRecipe, base_dir: Path, source: str | None, sizer: DatasetSizer, problems: list[FieldProblem]
) -> Resolution:
    run, ext = recipe.run, recipe.openrft
    b = SpecBuilder(problems)
    b.derived("dialect", "nova", "a Nova MTRL (multi-turn RFT) recipe")
    apply_extensions(b, ext, COVERED, "Nova MTRL")
    b.take("name", run, "name", "run.name")
    metadata = {"model_type": run.model_type}
    for name in ("display_name", "recipe_version"):
        if getattr(recipe, name) is not None:
            metadata[name] = getattr(recipe, name)
    b.derived("metadata", metadata, "the recipe's run.model_type, display_name and recipe_version", "run.model_type")
    run_locations(
        b,
        run,
        base_dir,
        "is required: an MTRL recipe leaves the training dataset to its launcher's job inputs; write it in run (a "
        "local path or a URI, an s3:// one mapped with --map URI=PATH)",
    )
    _model(b, recipe.model, ext, base_dir)
    _sampling(b, recipe)
    _algorithm(b, recipe.rl, recipe.data_filter)
    prompts = _schedule(b, recipe, sizer)
    _validation(b, recipe)
    _rollout(b, recipe)
    _reward(b, run, ext, base_dir)
    for name in MLFLOW_SETTINGS:
        b.take(f"tracking.{name}", run, name, f"run.{name}")
    return b.build(source, prompts)


def _model(b: SpecBuilder, model: MtrlModel, ext: OpenRFTExtensions, base_dir: Path) -> None:
    if model.model_name:
        b.model(model.model_name, base_dir, "model.model_name")
    else:
        b.problem("model.model_name", "is required: the base model (a Nova model must be mapped with --map-model)")
    b.take("sampling.max_length", model, "max_sequence_length", "model.max_sequence_length")
    b.take("lora.rank", model, "lora_rank", "model.lora_rank")
    b.take("lora.alpha", model, "lora_alpha", "model.lora_alpha", float(model.lora_alpha))
    b.take("lora.lora_plus_lr_ratio", model, "lora_plus_lr_ratio", "model.lora_plus_lr_ratio")
    b.take("optimizer.lr", model, "learning_rate", "model.learning_rate")
    base_learning_rate(b, ext)  # informational: the rate itself is set
    for name in ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay"):
        b.take(f"optimizer.{name}", model, name, f"model.{name}")
    b.take("optimizer.max_grad_norm", model, "grad_clip_norm", "model.grad_clip_norm", note="0 = no gradient clipping")


def _sampling(b: SpecBuilder, recipe: MtrlRecipe) -> None:
    batch, sampling = recipe.batch, recipe.sampling_params
    b.take("sampling.samples_per_prompt", batch, "group_size", "batch.group_size")
    b.take("sampling.temperature", sampling, "temperature", "sampling_params.temperature")
    if sampling.top_p == 0:
        b.problem("sampling_params.top_p", "must be above 0 (0 keeps no token to sample)", 0)
    else:
        b.take("sampling.top_p", sampling, "top_p", "sampling_params.top_p")
    b.take("sampling.max_new_tokens", sampling, "max_tokens", "sampling_params.max_tokens")


def _algorithm(b: SpecBuilder, rl: MtrlRl, data_filter: MtrlDataFilter | None) -> None:
    if rl.advantage_method != "group_based":
        b.problem(
            "rl.advantage_method",
            "is not supported by OpenRFT: it computes group_based advantages only (each episode's reward against "
            "its group's mean, docs/algorithm.md)",
            rl.advantage_method,
        )
    else:
        b.derived(
            "algorithm.scale_advantages_by_std",
            rl.advantage_normalization,
            "group_based advantages, divided by the group's std when advantage_normalization is true",
            "rl.advantage_normalization",
        )
    if rl.gamma != 1.0:
        b.problem(
            "rl.gamma",
            "is not supported below 1: OpenRFT scores each episode once, at its end, so there is no per-turn "
            "reward to discount",
            rl.gamma,
        )
    b.take("algorithm.loss_fn", rl, "loss_fn", "rl.loss_fn")
    thresholds = {"clip_low_threshold": rl.clip_low_threshold, "clip_high_threshold": rl.clip_high_threshold}
    if rl.clip_low_threshold > rl.clip_high_threshold:
        b.problem("rl.clip_low_threshold", f"is above rl.clip_high_threshold ({rl.clip_high_threshold})")
    if rl.loss_fn == "importance_sampling":
        for name in thresholds:
            if was_set(rl, name):
                b.warn(f"rl.{name}", "is not used by importance_sampling (no clipping)", thresholds[name])
        b.default("algorithm.loss_fn_config", {}, "rl.loss_fn", "importance_sampling takes no setting")
    else:
        origin = "user" if was_set(rl, "clip_low_threshold") or was_set(rl, "clip_high_threshold") else "default"
        b.set("algorithm.loss_fn_config", thresholds, origin, "rl.clip_low_threshold", "rl.clip_*_threshold")
    if data_filter is not None:
        b.user("algorithm.data_filter", data_filter.model_dump(), "data_filter")


def _schedule(b: SpecBuilder, recipe: MtrlRecipe, sizer: DatasetSizer) -> int | None:
    """Prompts per step, and steps: the epochs over the counted dataset, at most ``max_steps``."""
    batch, schedule = recipe.batch, recipe.schedule
    per_step = b.take("training.prompts_per_step", batch, "training_batch_size", "batch.training_batch_size")
    prompts = training_prompts(b, sizer, "run.data_s3_path", None, validation_field="run.validation_data_s3_path")
    b.take("training.epochs", schedule, "epochs", "schedule.epochs", float(schedule.epochs))
    if prompts:
        by_epochs = steps_for_epochs(exact(schedule.epochs), prompts, per_step)
        steps = min(by_epochs, schedule.max_steps)
        b.derived(
            "training.total_steps",
            steps,
            f"min(ceil(epochs × prompts / training_batch_size), max_steps) = "
            f"min(ceil({schedule.epochs} × {prompts} / {per_step}), {schedule.max_steps})",
            "schedule.max_steps",
        )
    else:
        b.take("training.total_steps", schedule, "max_steps", "schedule.max_steps", note="the dataset is not counted")
    b.take("checkpoint.interval", schedule, "save_every", "schedule.save_every", note="0 = only at the end")
    return prompts


def _validation(b: SpecBuilder, recipe: MtrlRecipe) -> None:
    batch, schedule, val, metrics = recipe.batch, recipe.schedule, recipe.val_sampling_params, recipe.val_metrics_config
    b.take("evaluation.interval", schedule, "val_every", "schedule.val_every", note="0 = only before and after")
    b.take("evaluation.at_start", schedule, "val_at_start", "schedule.val_at_start")
    b.take("evaluation.samples_per_prompt", batch, "val_group_size", "batch.val_group_size")
    b.take("evaluation.max_examples", batch, "val_batch_size", "batch.val_batch_size", note="null = every example")
    if batch.val_random_sample:
        b.problem(
            "batch.val_random_sample",
            "is not supported: OpenRFT validates on a fixed subset (the first val_batch_size examples), so that "
            "every validation compares the same prompts; set it to false",
            True,
        )
    b.take("evaluation.temperature", val, "temperature", "val_sampling_params.temperature")
    sampling = recipe.sampling_params
    for name, trained in (("top_p", sampling.top_p), ("max_tokens", sampling.max_tokens)):
        value = getattr(val, name)
        if value is not None and value != trained:
            b.problem(
                f"val_sampling_params.{name}",
                f"differs from sampling_params.{name} ({trained}): OpenRFT validates with the training "
                f"{name}; only the temperature may differ",
                value,
            )
    b.take("evaluation.pass_k", metrics, "pass_k_values", "val_metrics_config.pass_k_values")
    b.take("evaluation.success_threshold", metrics, "success_threshold", "val_metrics_config.success_threshold")
    beyond = [k for k in metrics.pass_k_values if k > batch.val_group_size]
    if beyond:
        b.warn(
            "val_metrics_config.pass_k_values",
            f"{', '.join(map(str, beyond))}: pass@k needs at least k samples of each prompt, and "
            f"batch.val_group_size is {batch.val_group_size}; those are not reported",
            metrics.pass_k_values,
        )


def _rollout(b: SpecBuilder, recipe: MtrlRecipe) -> None:
    rollout, off_policy = recipe.rollout, recipe.async_config.max_steps_off_policy
    field = "async_config.max_steps_off_policy"
    if off_policy == 0:
        b.take("rollout.strategy", recipe.async_config, "max_steps_off_policy", field, "sync")
        b.derived("rollout.age_tolerance", 0, "max_steps_off_policy 0: synchronous rollouts", field)
    else:
        b.take("rollout.strategy", recipe.async_config, "max_steps_off_policy", field, "off_policy_async")
        b.take("rollout.age_tolerance", recipe.async_config, "max_steps_off_policy", field)
    b.take("reward.remote.max_concurrency", rollout, "max_concurrency", "rollout.max_concurrency")
    b.take("reward.remote.timeout_s", rollout, "timeout", "rollout.timeout")
    b.take("reward.remote.max_retries", rollout, "max_retries", "rollout.max_retries")
    if rollout.rollout_tps is not None:
        b.warn(
            "rollout.rollout_tps",
            "is not used: OpenRFT bounds the calls in flight (rollout.max_concurrency), not their rate",
            rollout.rollout_tps,
        )


def _reward(b: SpecBuilder, run: MtrlRun, ext: OpenRFTExtensions, base_dir: Path) -> None:
    if run.reward_lambda_arn:
        lambda_reward(b, run.reward_lambda_arn, "run.reward_lambda_arn", ext.lambda_map, base_dir)
    elif ANY_LAMBDA in ext.lambda_map:
        lambda_reward(b, None, "run.reward_lambda_arn", ext.lambda_map, base_dir)
    else:
        b.problem(
            "run.reward_lambda_arn",
            "is required: an MTRL recipe leaves the episodes' reward to its launcher; name the reward Lambda "
            "(an ARN mapped with --map-lambda, a handler file path.py:lambda_handler or an http(s) URL)",
        )
