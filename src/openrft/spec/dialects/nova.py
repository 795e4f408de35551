"""The Amazon Nova RFT recipe (YAML) -> JobSpec.

The recipe's own fields are modelled as Nova documents them (CONTRACTS.md §1); OpenRFT's own knobs
live in one extra top-level block, ``openrft:``, so that a recipe stays readable as a Nova recipe.
Errors name the YAML path, e.g. ``training_config.trainer.clip_ratio_high: -1 must be >= 0``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openrft.spec.errors import FieldProblem, SpecError, problems_from_validation
from openrft.spec.job import (
    AlgorithmSpec,
    CheckpointSpec,
    DataSpec,
    EvalSpec,
    JobSpec,
    LoraSpec,
    ModelSpec,
    OptimizerSpec,
    RolloutSpec,
    RuntimeSpec,
    SamplingSpec,
    TrackingSpec,
    TrainingSpec,
)
from openrft.spec.locations import resolve_location
from openrft.spec.rewards import PresetReward, RewardSpec

GLOBAL_BATCH_SIZES = (16, 32, 64, 128, 256)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NovaRun(_Strict):
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


class NovaData(_Strict):
    shuffle: bool = True


class NovaRolloutStrategy(_Strict):
    type: Literal["sync", "off_policy_async"] = "sync"
    age_tolerance: int | None = Field(None, ge=0)


class NovaAdvantageStrategy(_Strict):
    number_generation: int = Field(4, ge=2, le=512)


class NovaGenerator(_Strict):
    max_new_tokens: int = Field(6000, ge=1)
    set_random_seed: bool = True
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(0, ge=0)


class NovaApiEndpoint(_Strict):
    lambda_arn: str
    lambda_concurrency_limit: int = Field(12, ge=1)
    lambda_batch_size: int = Field(128, ge=1)


class NovaRewards(_Strict):
    preset_reward_function: Literal["exact_match"] | None = None
    api_endpoint: NovaApiEndpoint | None = None


class NovaRollout(_Strict):
    rollout_strategy: NovaRolloutStrategy = NovaRolloutStrategy()
    advantage_strategy: NovaAdvantageStrategy = NovaAdvantageStrategy()
    generator: NovaGenerator = NovaGenerator()
    rewards: NovaRewards = NovaRewards()


class NovaOptim(_Strict):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0, le=1)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)


class NovaLoraTuning(_Strict):
    alpha: float = Field(64, gt=0)
    lora_plus_lr_ratio: float = Field(64.0, ge=0, le=100)


class NovaPeft(_Strict):
    peft_scheme: Literal["lora"] | None = "lora"
    lora_tuning: NovaLoraTuning = NovaLoraTuning()


class NovaCurriculum(_Strict):
    enable: bool = False
    selection_pool_multiplier: int = Field(8, ge=1, le=32)
    prediction_mode: Literal["pass_rate", "spread"] = "pass_rate"
    exemplar_history_steps: int = Field(1, ge=1)
    reinforce_coef: float = Field(0.01, ge=0)
    predictor_prompt_column: str = "predictor_prompt"
    selection_lookahead_steps: int = Field(4, ge=1, le=16)


class NovaTrainer(_Strict):
    max_steps: int = Field(ge=1)
    save_steps: int = Field(5, ge=1)
    save_top_k: int = Field(5, ge=1)
    test_steps: int = Field(1, ge=1)
    refit_freq: int = Field(4, ge=1)
    clip_ratio_high: float = Field(0.2, ge=0)
    loss_scale: float = Field(1.0, gt=0)
    ent_coeff: float = Field(0.0, ge=0)
    kl_loss_coef: float = Field(0.0, ge=0)
    optim_config: NovaOptim = NovaOptim()
    peft: NovaPeft = NovaPeft()
    adaptive_curriculum: NovaCurriculum | None = None


class NovaTrainingConfig(_Strict):
    max_length: int = Field(8192, ge=2)
    global_batch_size: Literal[16, 32, 64, 128, 256] = 32
    reasoning_effort: Literal["high", "low"] | None = None
    data: NovaData = NovaData()
    rollout: NovaRollout = NovaRollout()
    trainer: NovaTrainer


class OpenRFTExtensions(_Strict):
    """OpenRFT's own settings, beside the Nova fields (documented in docs/hyperparameters.md)."""

    seed: int = 0
    lora_rank: int = Field(16, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    clip_ratio_low: float = Field(0.2, ge=0, le=1)
    max_grad_norm: float = Field(1.0, ge=0)
    micro_batch_tokens: int = Field(8192, ge=1)
    top_p: float = Field(1.0, gt=0, le=1)
    scale_advantages_by_std: bool = True
    on_reward_error: Literal["exclude", "zero", "fail"] = "exclude"
    eval_samples_per_prompt: int = Field(1, ge=1)
    eval_temperature: float | None = Field(None, ge=0)
    eval_max_examples: int | None = Field(None, ge=1)
    eval_at_start: bool = True
    max_train_examples: int | None = Field(None, ge=1)
    importance_weight_cap: float = Field(2.0, gt=0)
    runtime: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    generator_base_url: str | None = None
    device: str = "auto"
    threads: int | None = Field(None, ge=1)
    tensorboard: bool = True


class NovaRecipe(_Strict):
    run: NovaRun
    training_config: NovaTrainingConfig
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def parse_recipe(raw: Any, base_dir: Path | None = None, source: str | None = None) -> JobSpec:
    """Validate a recipe (already loaded from YAML) and resolve it into a JobSpec."""
    if not isinstance(raw, dict):
        problem = FieldProblem("<root>", "a Nova recipe is a YAML mapping with run and training_config")
        raise SpecError([problem], source)
    try:
        recipe = NovaRecipe.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc), source) from None
    return _resolve(recipe, base_dir or Path.cwd(), source)


def _resolve(recipe: NovaRecipe, base_dir: Path, source: str | None) -> JobSpec:
    run, tc, ext = recipe.run, recipe.training_config, recipe.openrft
    trainer, rollout = tc.trainer, tc.rollout
    problems: list[FieldProblem] = []

    n = rollout.advantage_strategy.number_generation
    if tc.global_batch_size % n:
        problems.append(
            FieldProblem(
                "training_config.global_batch_size",
                f"is not a multiple of rollout.advantage_strategy.number_generation ({n}): "
                "a step holds whole groups of samples",
                tc.global_batch_size,
            )
        )
    strategy = rollout.rollout_strategy
    if strategy.type == "sync" and strategy.age_tolerance not in (None, 0):
        problems.append(
            FieldProblem(
                "training_config.rollout.rollout_strategy.age_tolerance",
                "needs rollout_strategy.type: off_policy_async (sync rollouts have age 0)",
                strategy.age_tolerance,
            )
        )
    rewards = rollout.rewards
    if rewards.preset_reward_function is None and rewards.api_endpoint is None and run.reward_lambda_arn is None:
        problems.append(
            FieldProblem(
                "training_config.rollout.rewards",
                "names no reward: set preset_reward_function or api_endpoint.lambda_arn",
            )
        )
    curriculum = trainer.adaptive_curriculum
    if curriculum is not None and curriculum.enable:
        problems.append(
            FieldProblem(
                "training_config.trainer.adaptive_curriculum.enable",
                "is not supported yet by OpenRFT; set it to false",
                True,
            )
        )
    if rewards.preset_reward_function is None:
        problems.append(
            FieldProblem(
                "training_config.rollout.rewards.api_endpoint",
                "remote reward endpoints are not available in this build; use preset_reward_function",
            )
        )
    model_location = resolve_location(run.model_name_or_path, base_dir, model=True)
    if Path(model_location).is_absolute() and not Path(model_location).exists():
        problems.append(FieldProblem("run.model_name_or_path", "is not an existing model directory",
                                     run.model_name_or_path))
    if problems:
        raise SpecError(problems, source)

    seed = ext.seed if rollout.generator.set_random_seed else random.SystemRandom().randrange(2**31)
    try:
        return JobSpec(
            name=run.name,
            dialect="nova",
            model=ModelSpec(name_or_path=model_location),
            data=DataSpec(
                train=resolve_location(run.data_s3_path, base_dir),
                validation=resolve_location(run.validation_data_s3_path, base_dir),
                shuffle=tc.data.shuffle,
                max_train_examples=ext.max_train_examples,
            ),
            sampling=SamplingSpec(
                samples_per_prompt=n,
                max_new_tokens=rollout.generator.max_new_tokens,
                max_length=tc.max_length,
                temperature=rollout.generator.temperature,
                top_k=rollout.generator.top_k,
                top_p=ext.top_p,
                reasoning_effort=tc.reasoning_effort,
            ),
            rollout=RolloutSpec(
                strategy=strategy.type,
                age_tolerance=(strategy.age_tolerance if strategy.age_tolerance is not None else 2)
                if strategy.type == "off_policy_async"
                else 0,
                importance_weight_cap=ext.importance_weight_cap,
                replicas=run.replicas,
                generation_replicas=run.generation_replicas,
                runtime=ext.runtime,
                ray_address=ext.ray_address,
                generator_base_url=ext.generator_base_url,
            ),
            training=TrainingSpec(
                prompts_per_step=tc.global_batch_size // n,
                total_steps=trainer.max_steps,
                micro_batch_tokens=ext.micro_batch_tokens,
                seed=seed,
            ),
            optimizer=OptimizerSpec(
                lr=trainer.optim_config.lr,
                weight_decay=trainer.optim_config.weight_decay,
                adam_beta1=trainer.optim_config.adam_beta1,
                adam_beta2=trainer.optim_config.adam_beta2,
                max_grad_norm=ext.max_grad_norm,
            ),
            lora=LoraSpec(
                enabled=trainer.peft.peft_scheme == "lora",
                rank=ext.lora_rank,
                alpha=trainer.peft.lora_tuning.alpha,
                dropout=ext.lora_dropout,
                lora_plus_lr_ratio=trainer.peft.lora_tuning.lora_plus_lr_ratio,
            ),
            algorithm=AlgorithmSpec(
                clip_ratio_low=ext.clip_ratio_low,
                clip_ratio_high=trainer.clip_ratio_high,
                kl_loss_coef=trainer.kl_loss_coef,
                ent_coeff=trainer.ent_coeff,
                loss_scale=trainer.loss_scale,
                refit_freq=trainer.refit_freq,
                scale_advantages_by_std=ext.scale_advantages_by_std,
            ),
            evaluation=EvalSpec(
                interval=trainer.test_steps,
                at_start=ext.eval_at_start,
                samples_per_prompt=ext.eval_samples_per_prompt,
                temperature=ext.eval_temperature,
                max_examples=ext.eval_max_examples,
            ),
            checkpoint=CheckpointSpec(interval=trainer.save_steps, keep_top_k=trainer.save_top_k),
            reward=RewardSpec(
                function=PresetReward(name=rewards.preset_reward_function),
                on_error=ext.on_reward_error,
            ),
            tracking=TrackingSpec(
                tensorboard=ext.tensorboard,
                mlflow_tracking_uri=run.mlflow_tracking_uri,
                mlflow_experiment_name=run.mlflow_experiment_name,
                mlflow_run_name=run.mlflow_run_name,
            ),
            runtime=RuntimeSpec(device=ext.device, threads=ext.threads),
            output_dir=resolve_location(run.output_s3_path, base_dir),
        )
    except ValidationError as exc:
        raise SpecError(problems_from_validation(exc, "<resolved>"), source) from None
