"""The Amazon Nova RFT recipe (YAML) -> JobSpec.

The recipe's own fields are modelled as Nova documents them (CONTRACTS.md §1, seed document 002);
OpenRFT's own knobs live in one extra top-level block, ``openrft:``, so that a recipe stays readable
as a Nova recipe. Bedrock's request for the same job (``hyperParameters``, ``graderConfig``) is read
by ``spec.dialects.bedrock``. Errors name the YAML path, e.g.
``training_config.global_batch_size: 48 is not one of 16, 32, 64, 128, 256``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from openrft.spec.dialects.builder import SpecBuilder
from openrft.spec.dialects.common import (
    MLFLOW_SETTINGS,
    DatasetSizer,
    OpenRFTExtensions,
    Strict,
    apply_extensions,
    base_learning_rate,
    build_reward,
    closed,
    count_examples,
    rollout_strategy,
    training_prompts,
    validate_all,
)
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.locations import resolve_location
from openrft.spec.provenance import Resolution
from openrft.spec.rewards import NovaLambdaReward, PresetReward

GLOBAL_BATCH_SIZES = (16, 32, 64, 128, 256)
TC = "training_config"
ROLLOUT = f"{TC}.rollout"
TRAINER = f"{TC}.trainer"
REWARDS = f"{ROLLOUT}.rewards"
COVERED = {
    "base_learning_rate": f"{TRAINER}.optim_config.lr",
    "max_length": f"{TC}.max_length",
    "max_new_tokens": f"{ROLLOUT}.generator.max_new_tokens",
    "rollout_strategy": f"{ROLLOUT}.rollout_strategy.type",
    "age_tolerance": f"{ROLLOUT}.rollout_strategy.age_tolerance",
    "replicas": "run.replicas",
    "generation_replicas": "run.generation_replicas",
}


class NovaRun(Strict):
    name: str = "openrft-run"
    model_type: str | None = None
    model_name_or_path: str
    data_s3_path: str
    validation_data_s3_path: str | None = None
    output_s3_path: str | None = None
    replicas: int = Field(1, ge=1)
    generation_replicas: int = Field(1, ge=1)
    rollout_worker_replicas: int | None = Field(None, ge=1)
    reward_lambda_arn: str | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_experiment_name: str | None = None
    mlflow_run_name: str | None = None


class NovaData(Strict):
    shuffle: bool = True


class NovaRolloutStrategy(Strict):
    type: Literal["sync", "off_policy_async"] = "sync"
    age_tolerance: int | None = Field(None, ge=0)


class NovaAdvantageStrategy(Strict):
    number_generation: int = Field(4, ge=2, le=512)


class NovaGenerator(Strict):
    max_new_tokens: int = Field(6000, ge=1)
    set_random_seed: bool = True
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=0)


class NovaApiEndpoint(Strict):
    lambda_arn: str
    lambda_concurrency_limit: int = Field(12, ge=1)
    lambda_batch_size: int = Field(128, ge=1)


class NovaRewards(Strict):
    preset_reward_function: Literal["exact_match"] | None = None
    api_endpoint: NovaApiEndpoint | None = None


class NovaRollout(Strict):
    rollout_strategy: NovaRolloutStrategy = NovaRolloutStrategy()
    advantage_strategy: NovaAdvantageStrategy = NovaAdvantageStrategy()
    generator: NovaGenerator = NovaGenerator()
    rewards: NovaRewards = NovaRewards()


class NovaOptim(Strict):
    lr: float = Field(1e-6, gt=0)
    weight_decay: Annotated[float, closed(0, 1)] = 0.0
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)


class NovaLoraTuning(Strict):
    alpha: float = Field(64, gt=0)
    lora_plus_lr_ratio: Annotated[float, closed(0, 100)] = 64.0


class NovaPeft(Strict):
    peft_scheme: Literal["lora"] | None = "lora"
    lora_tuning: NovaLoraTuning = NovaLoraTuning()


class NovaCurriculum(Strict):
    enable: bool = False
    selection_pool_multiplier: int = Field(8, ge=1, le=32)
    prediction_mode: Literal["pass_rate", "spread"] = "pass_rate"
    exemplar_history_steps: int = Field(1, ge=1)
    reinforce_coef: float = Field(0.01, ge=0)
    predictor_prompt_column: str = "predictor_prompt"
    selection_lookahead_steps: int = Field(4, ge=1, le=16)


class NovaTrainer(Strict):
    max_steps: int = Field(ge=1)
    save_steps: int = Field(5, ge=1)
    save_top_k: int = Field(5, ge=1)
    test_steps: int = Field(1, ge=1)
    refit_freq: int = Field(4, ge=0, description="OpenRFT: 0 = never refresh the reference")
    clip_ratio_high: float = Field(0.2, ge=0)
    loss_scale: float = Field(1.0, gt=0)
    ent_coeff: float = Field(0.0, ge=0)
    kl_loss_coef: float = Field(0.0, ge=0)
    optim_config: NovaOptim = NovaOptim()
    peft: NovaPeft = NovaPeft()
    adaptive_curriculum: NovaCurriculum | None = None


class NovaTrainingConfig(Strict):
    max_length: int = Field(8192, ge=2)
    global_batch_size: Literal[16, 32, 64, 128, 256] = 32
    reasoning_effort: Literal["high", "low"] | None = None
    data: NovaData = NovaData()
    rollout: NovaRollout = NovaRollout()
    trainer: NovaTrainer


class NovaRecipe(Strict):
    run: NovaRun
    training_config: NovaTrainingConfig
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def parse_recipe(
    raw: Any, base_dir: Path | None = None, source: str | None = None, dataset_size: DatasetSizer = count_examples
) -> Resolution:
    """Validate a recipe (already loaded from YAML) and resolve it. A Bedrock request goes to bedrock.py."""
    from openrft.spec.dialects.bedrock import is_bedrock_request, parse_bedrock

    if isinstance(raw, dict) and is_bedrock_request(raw):
        return parse_bedrock(raw, base_dir, source, dataset_size)
    if not isinstance(raw, dict):
        problem = FieldProblem("<root>", "a Nova recipe is a YAML mapping with run and training_config")
        raise SpecError([problem], source)
    recipe, problems = validate_all(NovaRecipe, raw)
    if recipe is None:
        raise SpecError(problems, source)
    return _resolve(recipe, base_dir or Path.cwd(), source, dataset_size, problems)


def _resolve(
    recipe: NovaRecipe, base_dir: Path, source: str | None, sizer: DatasetSizer, problems: list[FieldProblem]
) -> Resolution:
    run, tc, ext = recipe.run, recipe.training_config, recipe.openrft
    trainer, rollout = tc.trainer, tc.rollout
    b = SpecBuilder(problems)
    b.derived("dialect", "nova", "a Nova recipe")
    apply_extensions(b, ext, COVERED, "Nova")
    b.take("name", run, "name", "run.name")
    b.model(run.model_name_or_path, base_dir, "run.model_name_or_path")
    base_learning_rate(b, run.model_name_or_path, ext)  # informational: the recipe sets lr itself
    if run.model_type:
        b.user("metadata", {"model_type": run.model_type}, "run.model_type")
    b.user("data.train", resolve_location(run.data_s3_path, base_dir), "run.data_s3_path")
    if run.validation_data_s3_path:
        b.user(
            "data.validation", resolve_location(run.validation_data_s3_path, base_dir), "run.validation_data_s3_path"
        )
    b.take("data.shuffle", tc.data, "shuffle", f"{TC}.data.shuffle")
    if run.output_s3_path:
        b.user("output_dir", resolve_location(run.output_s3_path, base_dir), "run.output_s3_path")

    _sampling(b, tc)
    _rollout(b, run, rollout)
    prompts = _training(b, tc, sizer)
    resolve_optimizer(b, trainer)
    resolve_intervals(b, trainer)
    _rewards(b, run, rollout.rewards)
    for name in MLFLOW_SETTINGS:
        b.take(f"tracking.{name}", run, name, f"run.{name}")
    curriculum = trainer.adaptive_curriculum
    if curriculum is not None and curriculum.enable:
        b.problem(
            f"{TRAINER}.adaptive_curriculum.enable",
            "is not supported yet by OpenRFT's engine; set it to false (the other adaptive_curriculum "
            "settings are validated all the same)",
            True,
        )
    return b.build(source, prompts)


def _sampling(b: SpecBuilder, tc: NovaTrainingConfig) -> None:
    generator = tc.rollout.generator
    b.take(
        "sampling.samples_per_prompt",
        tc.rollout.advantage_strategy,
        "number_generation",
        f"{ROLLOUT}.advantage_strategy.number_generation",
    )
    b.take("sampling.max_new_tokens", generator, "max_new_tokens", f"{ROLLOUT}.generator.max_new_tokens")
    b.take("sampling.max_length", tc, "max_length", f"{TC}.max_length")
    b.take("sampling.temperature", generator, "temperature", f"{ROLLOUT}.generator.temperature")
    b.take("sampling.top_k", generator, "top_k", f"{ROLLOUT}.generator.top_k")
    b.take("sampling.reasoning_effort", tc, "reasoning_effort", f"{TC}.reasoning_effort")
    if not generator.set_random_seed:
        b.derived(
            "training.seed",
            random.SystemRandom().randrange(2**31),
            "a random seed: set_random_seed is false",
            f"{ROLLOUT}.generator.set_random_seed",
        )


def _rollout(b: SpecBuilder, run: NovaRun, rollout: NovaRollout) -> None:
    rollout_strategy(b, rollout.rollout_strategy, "type", "age_tolerance", f"{ROLLOUT}.rollout_strategy")
    b.take("rollout.replicas", run, "replicas", "run.replicas")
    b.take("rollout.generation_replicas", run, "generation_replicas", "run.generation_replicas")


def _training(b: SpecBuilder, tc: NovaTrainingConfig, sizer: DatasetSizer) -> int | None:
    """Prompts per step and steps; the training prompts when the dataset can be counted (for epochs)."""
    n = tc.rollout.advantage_strategy.number_generation
    if tc.global_batch_size % n:
        b.problem(
            f"{TC}.global_batch_size",
            f"is not a multiple of rollout.advantage_strategy.number_generation "
            f"({n}): a step holds whole groups of samples",
            tc.global_batch_size,
        )
        return None
    per_step = tc.global_batch_size // n
    b.derived(
        "training.prompts_per_step",
        per_step,
        f"global_batch_size / number_generation = {tc.global_batch_size} / {n} (samples -> prompts)",
        f"{TC}.global_batch_size",
    )
    b.take("training.total_steps", tc.trainer, "max_steps", f"{TRAINER}.max_steps")
    prompts = training_prompts(b, sizer, "run.data_s3_path", None, validation_field="run.validation_data_s3_path")
    if prompts:
        steps = tc.trainer.max_steps
        b.derived(
            "training.epochs",
            steps * per_step / prompts,
            f"max_steps × prompts per step / prompts = {steps} × {per_step} / {prompts}",
            f"{TRAINER}.max_steps",
        )
    return prompts


def resolve_optimizer(b: SpecBuilder, trainer: NovaTrainer) -> None:
    optim, lora = trainer.optim_config, trainer.peft.lora_tuning
    for name in ("lr", "weight_decay", "adam_beta1", "adam_beta2"):
        b.take(f"optimizer.{name}", optim, name, f"{TRAINER}.optim_config.{name}")
    b.take(
        "lora.enabled", trainer.peft, "peft_scheme", f"{TRAINER}.peft.peft_scheme", trainer.peft.peft_scheme == "lora"
    )
    b.take("lora.alpha", lora, "alpha", f"{TRAINER}.peft.lora_tuning.alpha")
    b.take("lora.lora_plus_lr_ratio", lora, "lora_plus_lr_ratio", f"{TRAINER}.peft.lora_tuning.lora_plus_lr_ratio")
    for name in ("clip_ratio_high", "kl_loss_coef", "ent_coeff", "loss_scale", "refit_freq"):
        b.take(f"algorithm.{name}", trainer, name, f"{TRAINER}.{name}")


def resolve_intervals(b: SpecBuilder, trainer: NovaTrainer) -> None:
    b.take("evaluation.interval", trainer, "test_steps", f"{TRAINER}.test_steps")
    b.take("checkpoint.interval", trainer, "save_steps", f"{TRAINER}.save_steps")
    b.take("checkpoint.keep_top_k", trainer, "save_top_k", f"{TRAINER}.save_top_k")


def _rewards(b: SpecBuilder, run: NovaRun, rewards: NovaRewards) -> None:
    endpoint, arn = rewards.api_endpoint, run.reward_lambda_arn
    if endpoint and arn and endpoint.lambda_arn != arn:
        b.problem(
            "run.reward_lambda_arn",
            f"differs from {REWARDS}.api_endpoint.lambda_arn ({endpoint.lambda_arn!r}): name one reward endpoint",
            arn,
        )
        return
    if rewards.preset_reward_function and (endpoint or arn):
        field = f"{REWARDS}.api_endpoint" if endpoint else "run.reward_lambda_arn"
        b.problem(
            field,
            "is an alternative to preset_reward_function: set preset_reward_function to null for a "
            "custom reward, or remove this",
        )
        return
    if rewards.preset_reward_function:
        b.user(
            "reward.function", PresetReward(name=rewards.preset_reward_function), f"{REWARDS}.preset_reward_function"
        )
    elif endpoint:
        field = f"{REWARDS}.api_endpoint"
        config = build_reward(
            b,
            NovaLambdaReward,
            f"{field}.lambda_arn",
            endpoint=endpoint.lambda_arn,
            batch_size=endpoint.lambda_batch_size,
            concurrency_limit=endpoint.lambda_concurrency_limit,
        )
        if config is not None:
            b.user("reward.function", config, field)
    elif arn:
        config = build_reward(b, NovaLambdaReward, "run.reward_lambda_arn", endpoint=arn)
        if config is not None:
            b.user("reward.function", config, "run.reward_lambda_arn")
    else:
        b.problem(
            REWARDS, "names no reward: set preset_reward_function, api_endpoint.lambda_arn or run.reward_lambda_arn"
        )
