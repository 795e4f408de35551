"""The Amazon Nova RFT recipe (YAML) -> JobSpec.

The recipe's own fields are modelled as Nova documents them (docs/contracts.md §1);
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
    read_recipe,
    rollout_strategy,
    run_locations,
    steps_for_epochs,
    training_prompts,
)
from openrft.spec.dialects.lambdas import ANY_LAMBDA, lambda_reward
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.provenance import Resolution
from openrft.spec.rewards import PresetReward

GLOBAL_BATCH_SIZE_RANGE = (16, 256)
"""HyperPod documents any global_batch_size from 16 to 256 (the recipes' comments list the powers of two)."""
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
    model_name_or_path: str | None = None
    data_s3_path: str | None = None  # required: a problem of the resolver, so the others are reported too
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
    lambda_arn: str | None = None
    lambda_concurrency_limit: int = Field(12, ge=1, le=1000)  # AWS Lambda's default account concurrency
    lambda_batch_size: int = Field(128, ge=1, le=4096)


class NovaRewards(Strict):
    preset_reward_function: Literal["exact_match"] | None = None
    api_endpoint: NovaApiEndpoint | None = None


class NovaRollout(Strict):
    rollout_strategy: NovaRolloutStrategy = NovaRolloutStrategy()
    advantage_strategy: NovaAdvantageStrategy = NovaAdvantageStrategy()
    generator: NovaGenerator = NovaGenerator()
    rewards: NovaRewards = NovaRewards()


class NovaOptim(Strict):
    """``trainer.optim_config`` (HyperPod and the SageMaker training-job LoRA/full-rank recipes)."""

    lr: float = Field(1e-6, gt=0)
    weight_decay: Annotated[float, closed(0, 1)] = 0.0
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)


class NovaOptimSmtj(NovaOptim):
    """``trainer.optim``, the other launchers' spelling: also names the optimizer and a minimum rate."""

    optimizer: Literal["adam", "adamw", "Adam", "AdamW"] = "adam"
    min_lr: float = Field(0.0, ge=0)


class NovaLoraTuning(Strict):
    alpha: float = Field(64, gt=0)
    lora_plus_lr_ratio: Annotated[float, closed(0, 100)] | None = None
    loraplus_lr_ratio: Annotated[float, closed(0, 100)] | None = Field(None, description="HyperPod's spelling")
    adapter_dropout: float | None = Field(None, ge=0, lt=1)


class NovaPeft(Strict):
    peft_scheme: Literal["lora"] | None = "lora"
    lora_tuning: NovaLoraTuning = NovaLoraTuning()


class NovaModelBlock(Strict):
    """``training_config.model``: where some published recipes put ``peft``."""

    peft: NovaPeft | None = None


class NovaCurriculum(Strict):
    enable: bool = False
    selection_pool_multiplier: int = Field(8, ge=1, le=32)
    prediction_mode: Literal["pass_rate", "spread"] = "pass_rate"
    exemplar_history_steps: int = Field(1, ge=1)
    reinforce_coef: float = Field(0.01, ge=0)
    predictor_prompt_column: str = "predictor_prompt"
    selection_lookahead_steps: int = Field(4, ge=1, le=16)


class NovaTrainer(Strict):
    max_steps: int | None = Field(None, ge=1)
    save_steps: int = Field(5, ge=0, description="0 = save only at the end")
    save_top_k: int = Field(5, ge=1)
    test_steps: int = Field(1, ge=1, description="validation every N reference-model updates")
    refit_freq: int = Field(4, ge=0, description="reference model updated every N steps; OpenRFT: 0 = never")
    clip_ratio_high: float = Field(0.2, ge=0)
    loss_scale: float = Field(1.0, gt=0)
    ent_coeff: float | None = Field(None, ge=0)
    entropy_coeff: float | None = Field(None, ge=0, description="the other launchers' spelling of ent_coeff")
    kl_loss_coef: float = Field(0.0, ge=0)
    optim_config: NovaOptim | None = None
    optim: NovaOptimSmtj | None = None
    peft: NovaPeft | None = None
    adaptive_curriculum: NovaCurriculum | None = None


class NovaTrainingConfig(Strict):
    max_length: int = Field(8192, ge=2)
    global_batch_size: Annotated[int, closed(GLOBAL_BATCH_SIZE_RANGE[0], GLOBAL_BATCH_SIZE_RANGE[1])] = 32
    max_epochs: int | None = Field(None, ge=1)
    reasoning_effort: Literal["high", "low"] | None = None
    task_type: str | None = Field(None, description="the launcher's resolved config: omega_rl_train")
    data: NovaData = NovaData()
    rollout: NovaRollout = NovaRollout()
    model: NovaModelBlock | None = None
    trainer: NovaTrainer = NovaTrainer()


class NovaRecipe(Strict):
    run: NovaRun
    training_config: NovaTrainingConfig
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def parse_recipe(
    raw: Any, base_dir: Path | None = None, source: str | None = None, dataset_size: DatasetSizer = count_examples
) -> Resolution:
    """Validate a recipe (already loaded from YAML) and resolve it. (Bedrock's request for a Nova job is
    read by ``bedrock.parse_bedrock``; ``spec.dialects`` sends it there.)

    The recipe is first read as its launchers read it (``interpolation``): OmegaConf ``${...}`` resolved,
    blank values unset."""
    if not isinstance(raw, dict):
        problem = FieldProblem("<root>", "a Nova recipe is a YAML mapping with run and training_config")
        raise SpecError([problem], source)
    recipe, problems = read_recipe(NovaRecipe, raw, source)
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
    if run.model_name_or_path:
        b.model(run.model_name_or_path, base_dir, "run.model_name_or_path")
    elif run.model_type:
        b.model(run.model_type, base_dir, "run.model_type")
    else:
        b.problem("run.model_name_or_path", "is required (or run.model_type)")
    base_learning_rate(b, ext)  # informational: lr is set
    if run.model_type:
        b.user("metadata", {"model_type": run.model_type}, "run.model_type")
    run_locations(
        b,
        run,
        base_dir,
        "is blank: the training dataset is required (a template leaves it for its notebook to fill in): write it "
        "in the recipe, a local path or a URI (an s3:// one mapped with --map URI=PATH)",
    )
    b.take("data.shuffle", tc.data, "shuffle", f"{TC}.data.shuffle")

    _unused(b, recipe)
    _sampling(b, tc)
    _rollout(b, run, rollout)
    prompts = _training(b, tc, sizer)
    resolve_optimizer(b, trainer, tc.model)
    resolve_intervals(b, trainer)
    _rewards(b, run, rollout.rewards, ext, base_dir)
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


UNUSED = {
    "run.rollout_worker_replicas": "OpenRFT's rollout workers are run.generation_replicas",
    f"{TC}.task_type": "the launcher's task name; OpenRFT runs RFT training",
    f"{TRAINER}.optim.min_lr": "OpenRFT keeps the learning rate constant",
}


def _unused(b: SpecBuilder, recipe: NovaRecipe) -> None:
    """Warnings for the recipe's fields that OpenRFT accepts but does not use."""
    values = {
        "run.rollout_worker_replicas": recipe.run.rollout_worker_replicas,
        f"{TC}.task_type": recipe.training_config.task_type,
        f"{TRAINER}.optim.min_lr": recipe.training_config.trainer.optim.min_lr
        if recipe.training_config.trainer.optim and was_set(recipe.training_config.trainer.optim, "min_lr")
        else None,
    }
    for field, value in values.items():
        if value is not None:
            b.warn(field, f"is not used by OpenRFT ({UNUSED[field]})", value)


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
    """Prompts per step and steps (``trainer.max_steps``, else ``max_epochs`` over the counted dataset);
    the training prompts when the dataset can be counted."""
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
    steps, epochs = tc.trainer.max_steps, tc.max_epochs
    if steps is None and epochs is None:
        b.problem(f"{TRAINER}.max_steps", f"is required (or {TC}.max_epochs)")
        return None
    if steps is not None and epochs is not None:
        b.warn(f"{TC}.max_epochs", f"is not used: {TRAINER}.max_steps ({steps}) sets the length", epochs)
    needed = f"{TC}.max_epochs" if steps is None else None
    prompts = training_prompts(b, sizer, "run.data_s3_path", needed, validation_field="run.validation_data_s3_path")
    if steps is not None:
        b.take("training.total_steps", tc.trainer, "max_steps", f"{TRAINER}.max_steps")
        if prompts:
            b.derived(
                "training.epochs",
                steps * per_step / prompts,
                f"max_steps × prompts per step / prompts = {steps} × {per_step} / {prompts}",
                f"{TRAINER}.max_steps",
            )
    elif prompts:
        assert epochs is not None
        b.user("training.epochs", float(epochs), f"{TC}.max_epochs")
        b.derived(
            "training.total_steps",
            steps_for_epochs(epochs, prompts, per_step),
            f"ceil(max_epochs × prompts / prompts per step) = ceil({epochs} × {prompts} / {per_step})",
            f"{TC}.max_epochs",
        )
    return prompts


def _one_of(b: SpecBuilder, values: dict[str, Any]) -> tuple[str, Any] | None:
    """The one value given among several spellings of a field (path -> value or None); a problem if two
    differ. None when none is given."""
    given = {path: value for path, value in values.items() if value is not None}
    if len({repr(v) for v in given.values()}) > 1:
        first, *others = given
        b.problem(others[0], f"is also given as {first}: write it in one place", given[others[0]])
    return next(iter(given.items()), None)


def resolve_optimizer(b: SpecBuilder, trainer: NovaTrainer, model: NovaModelBlock | None = None) -> None:
    """Optimizer, LoRA (or full rank) and algorithm settings, from either launcher's spelling."""
    picked = _one_of(b, {f"{TRAINER}.optim_config": trainer.optim_config, f"{TRAINER}.optim": trainer.optim})
    optim_field, optim = picked if picked else (f"{TRAINER}.optim_config", NovaOptim())
    for name in ("lr", "weight_decay", "adam_beta1", "adam_beta2"):
        b.take(f"optimizer.{name}", optim, name, f"{optim_field}.{name}")
    _peft(b, trainer, model)
    entropy = _one_of(b, {f"{TRAINER}.ent_coeff": trainer.ent_coeff, f"{TRAINER}.entropy_coeff": trainer.entropy_coeff})
    if entropy:
        b.user("algorithm.ent_coeff", entropy[1], entropy[0])
    else:
        b.default("algorithm.ent_coeff", 0.0, f"{TRAINER}.ent_coeff")
    for name in ("clip_ratio_high", "kl_loss_coef", "loss_scale", "refit_freq"):
        b.take(f"algorithm.{name}", trainer, name, f"{TRAINER}.{name}")


def _peft(b: SpecBuilder, trainer: NovaTrainer, model: NovaModelBlock | None) -> None:
    """LoRA from ``trainer.peft`` or ``training_config.model.peft``; no peft block, or ``peft_scheme: null``,
    is full-rank training, as on the service."""
    picked = _one_of(b, {f"{TRAINER}.peft": trainer.peft, f"{TC}.model.peft": model.peft if model else None})
    if picked is None:
        b.default(
            "lora.enabled",
            False,
            f"{TRAINER}.peft",
            "no peft block: full-rank training (all weights), as on the service",
        )
        return
    field, peft = picked
    if peft.peft_scheme is None:
        b.set("lora.enabled", False, "user", f"{field}.peft_scheme", "peft_scheme null: full-rank training")
        return
    b.take("lora.enabled", peft, "peft_scheme", f"{field}.peft_scheme", True)
    lora, tuning = peft.lora_tuning, f"{field}.lora_tuning"
    b.take("lora.alpha", lora, "alpha", f"{tuning}.alpha")
    spellings = {f"{tuning}.lora_plus_lr_ratio": lora.lora_plus_lr_ratio}
    ratio = _one_of(b, {**spellings, f"{tuning}.loraplus_lr_ratio": lora.loraplus_lr_ratio})
    if ratio:
        b.user("lora.lora_plus_lr_ratio", ratio[1], ratio[0])
    else:
        b.default("lora.lora_plus_lr_ratio", 64.0, f"{tuning}.lora_plus_lr_ratio", "the Nova recipe's default")
    if lora.adapter_dropout is not None:
        b.user("lora.dropout", lora.adapter_dropout, f"{tuning}.adapter_dropout")


def resolve_intervals(b: SpecBuilder, trainer: NovaTrainer) -> None:
    """Nova's cadences. ``test_steps`` counts reference-model updates (Nova: "run validation every N
    reference model updates"), each ``refit_freq`` steps apart, so validation runs every
    ``test_steps × refit_freq`` steps; with ``refit_freq: 0`` (never, OpenRFT's value) every ``test_steps``."""
    field = f"{TRAINER}.test_steps"
    if trainer.refit_freq:
        interval = trainer.test_steps * trainer.refit_freq
        note = f"test_steps × refit_freq = {trainer.test_steps} × {trainer.refit_freq} steps (reference updates)"
        b.derived("evaluation.interval", interval, note, field)
    else:
        b.take(
            "evaluation.interval", trainer, "test_steps", field, note="in steps: refit_freq 0 has no reference updates"
        )
    b.take("checkpoint.interval", trainer, "save_steps", f"{TRAINER}.save_steps")
    b.take("checkpoint.keep_top_k", trainer, "save_top_k", f"{TRAINER}.save_top_k")


def _rewards(b: SpecBuilder, run: NovaRun, rewards: NovaRewards, ext: OpenRFTExtensions, base_dir: Path) -> None:
    endpoint, arn = rewards.api_endpoint, run.reward_lambda_arn
    endpoint_arn = endpoint.lambda_arn if endpoint else None
    if endpoint_arn and arn and endpoint_arn != arn:
        b.problem(
            "run.reward_lambda_arn",
            f"differs from {REWARDS}.api_endpoint.lambda_arn ({endpoint_arn!r}): name one reward endpoint",
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
    elif endpoint is not None or arn:
        field = f"{REWARDS}.api_endpoint.lambda_arn" if endpoint_arn or not arn else "run.reward_lambda_arn"
        call = (
            {"batch_size": endpoint.lambda_batch_size, "concurrency_limit": endpoint.lambda_concurrency_limit}
            if endpoint
            else {}
        )
        lambda_reward(b, endpoint_arn or arn, field, ext.lambda_map, base_dir, **call)
    elif ANY_LAMBDA in ext.lambda_map:
        lambda_reward(b, None, "run.reward_lambda_arn", ext.lambda_map, base_dir)
    else:
        b.problem(
            REWARDS, "names no reward: set preset_reward_function, api_endpoint.lambda_arn or run.reward_lambda_arn"
        )
