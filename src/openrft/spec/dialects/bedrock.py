"""Bedrock's request for a Nova RFT job (CreateModelCustomizationJob, CONTRACTS.md §1) -> JobSpec.

The same training as a Nova recipe, written with Bedrock's ``hyperParameters`` (``batchSize`` counts
samples, like the recipe's ``global_batch_size``) and ``graderConfig.lambdaGrader``. Both shapes are
accepted: the blocks at the top level, or under ``customizationConfig.rftConfig``. Settings Bedrock
does not expose take the Nova recipe's defaults. Part of the ``nova`` dialect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from openrft.spec.dialects.builder import SpecBuilder, was_set
from openrft.spec.dialects.common import (
    DatasetSizer,
    OpenRFTExtensions,
    Strict,
    apply_extensions,
    base_learning_rate,
    closed,
    count_examples,
    fmt,
    steps_for_epochs,
    tracking_from_metadata,
    training_prompts,
    validate_all,
)
from openrft.spec.dialects.lambdas import ANY_LAMBDA, lambda_reward
from openrft.spec.dialects.nova import NovaPeft, NovaTrainer, resolve_intervals, resolve_optimizer
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.locations import resolve_location
from openrft.spec.provenance import Resolution

TRAIN_LIMIT = 20_000
BEDROCK_KEYS = ("hyperParameters", "graderConfig", "customizationConfig", "baseModelIdentifier", "customizationType")
AWS_ONLY = ("roleArn", "clientRequestToken", "customModelKmsKeyId", "vpcConfig")


class BedrockHyperParameters(Strict):
    """Defaults are the Nova recipe's (docs/hyperparameters.md): Bedrock documents ranges, not defaults."""

    epochCount: Annotated[int, closed(1, 50)] = 1
    batchSize: Annotated[int, closed(16, 512)] = 32
    learningRate: Annotated[float, closed(1e-7, 1e-3)] = 1e-6
    maxPromptLength: int = Field(2192, ge=1)
    trainingSamplePerPrompt: Annotated[int, closed(2, 16)] = 4
    inferenceMaxTokens: int = Field(6000, ge=1)
    reasoningEffort: Literal["low", "medium", "high"] | None = None
    evalInterval: Annotated[int, closed(1, 100)] = 1


class LambdaGrader(Strict):
    lambdaArn: str


class GraderConfig(Strict):
    lambdaGrader: LambdaGrader | None = None


class RftConfig(Strict):
    hyperParameters: BedrockHyperParameters = BedrockHyperParameters()
    graderConfig: GraderConfig | None = None


class CustomizationConfig(Strict):
    rftConfig: RftConfig


class S3Location(Strict):
    s3Uri: str


class TrainingDataConfig(Strict):
    s3Uri: str | None = None
    invocationLogsConfig: dict[str, Any] | None = None


class ValidationDataConfig(Strict):
    validators: list[S3Location] = Field(max_length=10)


class Tag(Strict):
    key: str
    value: str


class BedrockRequest(Strict):
    jobName: str = "openrft-run"
    customModelName: str | None = None
    baseModelIdentifier: str
    customizationType: Literal["REINFORCEMENT_FINE_TUNING"] = "REINFORCEMENT_FINE_TUNING"
    trainingDataConfig: TrainingDataConfig
    validationDataConfig: ValidationDataConfig | None = None
    outputDataConfig: S3Location | None = None
    hyperParameters: BedrockHyperParameters | None = None
    graderConfig: GraderConfig | None = None
    customizationConfig: CustomizationConfig | None = None
    jobTags: list[Tag] = Field(default_factory=list)
    customModelTags: list[Tag] = Field(default_factory=list)
    roleArn: str | None = None
    clientRequestToken: str | None = None
    customModelKmsKeyId: str | None = None
    vpcConfig: dict[str, Any] | None = None
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def is_bedrock_request(raw: dict[str, Any]) -> bool:
    return any(key in raw for key in BEDROCK_KEYS) and "training_config" not in raw


def parse_bedrock(
    raw: Any, base_dir: Path | None = None, source: str | None = None, dataset_size: DatasetSizer = count_examples
) -> Resolution:
    request, problems = validate_all(BedrockRequest, raw)
    if request is None:
        raise SpecError(problems, source)
    return _resolve(request, base_dir or Path.cwd(), source, dataset_size, problems)


def _blocks(b: SpecBuilder, request: BedrockRequest) -> tuple[BedrockHyperParameters, GraderConfig | None, str]:
    """The hyperParameters and graderConfig of either shape, and the path prefix the user wrote them at."""
    nested = request.customizationConfig
    if nested is not None:
        for name in ("hyperParameters", "graderConfig"):
            if getattr(request, name) is not None:
                b.problem(name, "is also given under customizationConfig.rftConfig: write it in one place")
        return nested.rftConfig.hyperParameters, nested.rftConfig.graderConfig, "customizationConfig.rftConfig."
    return request.hyperParameters or BedrockHyperParameters(), request.graderConfig, ""


def _resolve(
    request: BedrockRequest, base_dir: Path, source: str | None, sizer: DatasetSizer, problems: list[FieldProblem]
) -> Resolution:
    b = SpecBuilder(problems)
    hp, grader, at = _blocks(b, request)
    HP = f"{at}hyperParameters"
    b.derived("dialect", "nova", "a Bedrock request for a Nova RFT job")
    apply_extensions(
        b,
        request.openrft,
        {
            "base_learning_rate": f"{HP}.learningRate",
            "max_length": f"{HP}.maxPromptLength + inferenceMaxTokens",
            "max_new_tokens": f"{HP}.inferenceMaxTokens",
        },
        "Bedrock",
    )
    for name in AWS_ONLY:
        if getattr(request, name) is not None:
            b.warn(name, "is an AWS setting; OpenRFT ignores it")
    b.take("name", request, "jobName", "jobName")
    tags = {t.key: t.value for t in [*request.jobTags, *request.customModelTags]}
    if tags or request.customModelName:
        b.user(
            "metadata",
            {**tags, **({"customModelName": request.customModelName} if request.customModelName else {})},
            "jobTags, customModelTags, customModelName",
        )
    tracking_from_metadata(b, tags, "jobTags")
    b.model(request.baseModelIdentifier, base_dir, "baseModelIdentifier")
    base_learning_rate(b, request.openrft)  # informational: learningRate is set
    training = request.trainingDataConfig
    if training.s3Uri is None:
        why = "invocation logs are read only by Bedrock" if training.invocationLogsConfig else "it is required"
        b.problem("trainingDataConfig.s3Uri", f"is not given ({why}): give the training JSONL file")
    b.user("data.train", resolve_location(training.s3Uri or "<missing>", base_dir), "trainingDataConfig.s3Uri")
    limit = "Bedrock's limit of 20K prompts"
    if b.mapped_model is not None:  # Bedrock's limits are its rules for its Nova models
        limit += (
            f" for {request.baseModelIdentifier}, kept for the model it is mapped to (the hyperParameters ranges "
            "too); openrft.max_train_examples caps the examples read"
        )
    b.default("data.train_examples_limit", TRAIN_LIMIT, "trainingDataConfig.s3Uri", limit)
    validators = request.validationDataConfig.validators if request.validationDataConfig else []
    if len(validators) > 1:
        b.warn("validationDataConfig.validators", f"lists {len(validators)} files; OpenRFT validates on the first")
    if validators:
        b.user(
            "data.validation",
            resolve_location(request.validationDataConfig.validators[0].s3Uri, base_dir),
            "validationDataConfig.validators[0].s3Uri",
        )
    if request.outputDataConfig:
        b.user("output_dir", resolve_location(request.outputDataConfig.s3Uri, base_dir), "outputDataConfig.s3Uri")

    # What Bedrock does not expose is the recipe's default; Bedrock's own fields override.
    recipe_trainer = NovaTrainer(max_steps=1, peft=NovaPeft())
    resolve_optimizer(b, recipe_trainer)
    resolve_intervals(b, recipe_trainer)
    for path, origin in list(b.sources.items()):
        if origin.field and origin.field.startswith("training_config."):
            b.default(path, b.values[path], None, f"the Nova recipe's default for {origin.field}")
    b.take("optimizer.lr", hp, "learningRate", f"{HP}.learningRate")
    b.take("evaluation.interval", hp, "evalInterval", f"{HP}.evalInterval")
    b.take("sampling.samples_per_prompt", hp, "trainingSamplePerPrompt", f"{HP}.trainingSamplePerPrompt")
    b.take("sampling.max_new_tokens", hp, "inferenceMaxTokens", f"{HP}.inferenceMaxTokens")
    written = was_set(hp, "maxPromptLength") or was_set(hp, "inferenceMaxTokens")
    b.set(
        "sampling.max_length",
        hp.maxPromptLength + hp.inferenceMaxTokens,
        "derived" if written else "default",
        f"{HP}.maxPromptLength",
        f"maxPromptLength + inferenceMaxTokens = {hp.maxPromptLength} + {hp.inferenceMaxTokens}",
    )
    b.take("sampling.reasoning_effort", hp, "reasoningEffort", f"{HP}.reasoningEffort")

    n, prompts = hp.trainingSamplePerPrompt, None
    if hp.batchSize % n:
        b.problem(
            f"{HP}.batchSize",
            f"is not a multiple of trainingSamplePerPrompt ({n}): a step holds whole groups of samples",
            hp.batchSize,
        )
    else:
        per_step = hp.batchSize // n
        b.derived(
            "training.prompts_per_step",
            per_step,
            f"batchSize / trainingSamplePerPrompt = {hp.batchSize} / {n} (samples -> prompts)",
            f"{HP}.batchSize",
        )
        prompts = training_prompts(b, sizer, "trainingDataConfig.s3Uri", "epochCount")
        if prompts:
            b.take("training.epochs", hp, "epochCount", f"{HP}.epochCount", float(hp.epochCount))
            steps = steps_for_epochs(hp.epochCount, prompts, per_step)
            b.derived(
                "training.total_steps",
                steps,
                f"ceil(epochCount × prompts / prompts per step) = ceil({fmt(hp.epochCount)} × {prompts} / {per_step})",
                f"{HP}.epochCount",
            )

    lambdas = request.openrft.lambda_map
    if grader is not None and grader.lambdaGrader is not None:
        field = f"{at}graderConfig.lambdaGrader.lambdaArn"
        lambda_reward(b, grader.lambdaGrader.lambdaArn, field, lambdas, base_dir)
    elif ANY_LAMBDA in lambdas:
        lambda_reward(b, None, f"{at}graderConfig.lambdaGrader.lambdaArn", lambdas, base_dir)
    else:
        b.problem(f"{at}graderConfig", "is required: graderConfig.lambdaGrader.lambdaArn names the reward function")
    return b.build(source, prompts)
