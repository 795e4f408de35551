"""The Vertex AI ``tuningJobs`` request with a ``reinforcementTuningSpec`` (docs/contracts.md §2) -> JobSpec.

Defaults and limits are Vertex's (docs/contracts.md §2): the step count derives from ``epochCount`` and
the number of prompts in the training set, and the whole run is capped at 500 steps. How each field
becomes a canonical one is in docs/hyperparameters.md. Errors name the request's own field path.
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
    build_reward,
    closed,
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
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.locations import resolve_location
from openrft.spec.provenance import Resolution, Source
from openrft.spec.rewards import VertexReward, canonical_names

MAX_STEPS = 500
MAX_OUTPUT_TOKENS = 32_768
MAX_SAMPLES_PER_STEP = 8_192  # batchSize * samplesPerPrompt, text modality
SAMPLES_PER_STEP_MULTIPLE = 16
TRAIN_LIMIT, VALIDATION_LIMIT = 5_000, 500
PROMPT_TOKENS = 8_192  # room for the prompt when max_length is derived from maxOutputTokens
ADAPTER_RANKS = {
    "ADAPTER_SIZE_ONE": 1,
    "ADAPTER_SIZE_TWO": 2,
    "ADAPTER_SIZE_FOUR": 4,
    "ADAPTER_SIZE_EIGHT": 8,
    "ADAPTER_SIZE_SIXTEEN": 16,
    "ADAPTER_SIZE_THIRTY_TWO": 32,
}
THINKING_LEVELS = {"MINIMAL": "minimal", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}
THINKING_UNSPECIFIED = "REINFORCEMENT_TUNING_THINKING_LEVEL_UNSPECIFIED"
ADAPTER_UNSPECIFIED = "ADAPTER_SIZE_UNSPECIFIED"
IGNORED_REQUEST_FIELDS = {
    "serviceAccount": "jobs run as the user or service that starts them",
    "encryptionSpec": "outputs are written as they are; encrypt the output location itself",
    "customBaseModel": "give the model's local directory or Hugging Face id in baseModel",
}
HP = "reinforcementTuningSpec.hyperParameters"
SPEC = "reinforcementTuningSpec"


class VertexHyperParameters(Strict):
    epochCount: float | None = Field(None, gt=0)
    stepCount: int | None = Field(None, ge=1)
    learningRateMultiplier: Annotated[float, closed(0.25, 4)] = 1.0
    thinkingLevel: Literal[(THINKING_UNSPECIFIED, *THINKING_LEVELS)] = "HIGH"  # type: ignore[valid-type]
    thinkingBudget: int | None = Field(None, ge=-1, description="Gemini 2.5: -1 dynamic, 0 off, > 0 tokens")
    batchSize: int = Field(32, ge=1)
    samplesPerPrompt: int = Field(16, ge=2, description="OpenRFT: a group advantage needs 2 samples")
    evaluateInterval: int | None = Field(None, ge=1)
    checkpointInterval: int | None = Field(None, ge=1)
    maxOutputTokens: Annotated[int, closed(1, MAX_OUTPUT_TOKENS)] = MAX_OUTPUT_TOKENS
    adapterSize: Literal[(ADAPTER_UNSPECIFIED, *ADAPTER_RANKS)] = "ADAPTER_SIZE_SIXTEEN"  # type: ignore[valid-type]


class VertexTuningSpec(Strict):
    trainingDatasetUri: str
    validationDatasetUri: str | None = None
    hyperParameters: VertexHyperParameters = VertexHyperParameters()
    singleRewardConfig: dict[str, Any] | None = None
    compositeRewardConfig: dict[str, Any] | None = None


class VertexRequest(Strict):
    baseModel: str
    tunedModelDisplayName: str | None = None
    description: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    outputUri: str | None = None
    serviceAccount: str | None = None
    encryptionSpec: dict[str, Any] | None = None
    customBaseModel: str | None = None
    reinforcementTuningSpec: VertexTuningSpec
    openrft: OpenRFTExtensions = OpenRFTExtensions()


def parse_request(
    raw: Any, base_dir: Path | None = None, source: str | None = None, dataset_size: DatasetSizer = count_examples
) -> Resolution:
    """Validate a Vertex request (already loaded from JSON, in JSON or proto field names) and resolve it."""
    if not isinstance(raw, dict):
        raise SpecError(
            [FieldProblem("<root>", "a Vertex request is a JSON object with reinforcementTuningSpec")], source
        )
    spelling: list[FieldProblem] = []
    canonical = canonical_names(raw, problems=spelling)
    request, problems = validate_all(VertexRequest, canonical)
    problems = spelling + problems
    if request is None:
        raise SpecError(problems, source)
    resolution = _resolve(request, base_dir or Path.cwd(), source, dataset_size, problems)
    if canonical_names(raw) != raw:
        resolution.provenance["dialect"] = Source(
            "derived",
            None,
            "a Vertex reinforcementTuningSpec request, written with proto field names (shown here "
            "with their JSON names)",
        )
    return resolution


def _resolve(
    request: VertexRequest, base_dir: Path, source: str | None, sizer: DatasetSizer, problems: list[FieldProblem]
) -> Resolution:
    rts, hp, ext = request.reinforcementTuningSpec, request.reinforcementTuningSpec.hyperParameters, request.openrft
    b = SpecBuilder(problems)
    b.derived("dialect", "vertex", "a Vertex reinforcementTuningSpec request")
    apply_extensions(b, ext, {"lora_rank": f"{HP}.adapterSize", "max_new_tokens": f"{HP}.maxOutputTokens"}, "Vertex")
    if request.tunedModelDisplayName:
        b.user("name", request.tunedModelDisplayName, "tunedModelDisplayName")
    if request.labels or request.description:
        meta = {"labels": request.labels} if request.labels else {}
        b.user(
            "metadata",
            {**meta, **({"description": request.description} if request.description else {})},
            "labels, description",
        )
    tracking_from_metadata(b, request.labels, "labels")
    if request.outputUri:
        b.user("output_dir", resolve_location(request.outputUri, base_dir), "outputUri")
    for name, why in IGNORED_REQUEST_FIELDS.items():
        if getattr(request, name) is not None:
            b.warn(name, f"is not used by OpenRFT ({why}); ignored")

    b.model(request.baseModel, base_dir, "baseModel")
    base_rate = base_learning_rate(b, ext, f"Vertex's base rate for {request.baseModel} is not published")

    _data(b, rts, base_dir)
    batch, samples = hp.batchSize, hp.samplesPerPrompt
    b.take("training.prompts_per_step", hp, "batchSize", f"{HP}.batchSize")
    b.take("sampling.samples_per_prompt", hp, "samplesPerPrompt", f"{HP}.samplesPerPrompt")
    product = batch * samples
    if product % SAMPLES_PER_STEP_MULTIPLE:
        b.problem(f"{HP}.samplesPerPrompt", f"× batchSize ({batch}) = {product}, which is not divisible by 16", samples)
    elif product > MAX_SAMPLES_PER_STEP:
        b.problem(f"{HP}.samplesPerPrompt", f"× batchSize ({batch}) = {product:,}, which is more than 8,192", samples)

    b.take("sampling.max_new_tokens", hp, "maxOutputTokens", f"{HP}.maxOutputTokens")
    if ext.max_length is not None:
        b.user("sampling.max_length", ext.max_length, "openrft.max_length")
    else:
        b.derived(
            "sampling.max_length",
            hp.maxOutputTokens + PROMPT_TOKENS,
            f"maxOutputTokens + {PROMPT_TOKENS:,} prompt tokens",
            f"{HP}.maxOutputTokens",
        )
    _thinking(b, hp)
    rate = hp.learningRateMultiplier * base_rate
    b.derived(
        "optimizer.lr",
        rate,
        f"learningRateMultiplier {fmt(hp.learningRateMultiplier)} × base rate {base_rate:g}",
        f"{HP}.learningRateMultiplier",
    )
    size = "ADAPTER_SIZE_SIXTEEN" if hp.adapterSize == ADAPTER_UNSPECIFIED else hp.adapterSize
    rank = b.take("lora.rank", hp, "adapterSize", f"{HP}.adapterSize", ADAPTER_RANKS[size])
    b.derived(
        "lora.alpha",
        float(2 * rank),
        "2 × rank: the adapter scale alpha/rank is 2 for every adapterSize",
        f"{HP}.adapterSize",
    )

    prompts = _steps(b, hp, sizer)
    _intervals(b, hp, prompts)
    _reward(b, rts)
    return b.build(source, prompts)


def _thinking(b: SpecBuilder, hp: VertexHyperParameters) -> None:
    """``thinkingLevel`` (every value of the REST enum) or, for Gemini 2.5 jobs, ``thinkingBudget``."""
    level_set = was_set(hp, "thinkingLevel") and hp.thinkingLevel != THINKING_UNSPECIFIED
    if hp.thinkingBudget is not None and not level_set:
        budget = hp.thinkingBudget
        if budget == 0:
            b.user("sampling.reasoning_effort", None, f"{HP}.thinkingBudget")
            return
        if budget > 0:
            b.warn(
                f"{HP}.thinkingBudget",
                "is a number of thinking tokens, which open models' chat templates cannot cap: reasoning is "
                "on (effort high) and the answer is limited by maxOutputTokens only",
                budget,
            )
        b.set("sampling.reasoning_effort", "high", "user", f"{HP}.thinkingBudget", "reasoning on (effort high)")
        return
    if hp.thinkingBudget is not None:
        b.warn(
            f"{HP}.thinkingBudget",
            "is ignored: thinkingLevel is set (Gemini 3.5 and later take thinkingLevel only)",
            hp.thinkingBudget,
        )
    if hp.thinkingLevel == THINKING_UNSPECIFIED:
        b.default("sampling.reasoning_effort", "high", f"{HP}.thinkingLevel", "unspecified: Vertex's default HIGH")
        return
    b.take("sampling.reasoning_effort", hp, "thinkingLevel", f"{HP}.thinkingLevel", THINKING_LEVELS[hp.thinkingLevel])


def _data(b: SpecBuilder, rts: VertexTuningSpec, base_dir: Path) -> None:
    b.user("data.train", resolve_location(rts.trainingDatasetUri, base_dir), f"{SPEC}.trainingDatasetUri")
    if rts.validationDatasetUri:
        b.user("data.validation", resolve_location(rts.validationDatasetUri, base_dir), f"{SPEC}.validationDatasetUri")
    rule = "with no validation set, Vertex holds out 25% of training or 50 examples, whichever is larger"
    b.default("data.validation_fraction", 0.25, f"{SPEC}.validationDatasetUri", rule)
    b.default("data.validation_min_examples", 50, f"{SPEC}.validationDatasetUri", rule)
    b.default(
        "data.validation_max_examples",
        VALIDATION_LIMIT,
        f"{SPEC}.validationDatasetUri",
        "at most Vertex's validation limit",
    )
    b.default("data.train_examples_limit", TRAIN_LIMIT, f"{SPEC}.trainingDatasetUri", "Vertex's limit")
    b.default("data.validation_examples_limit", VALIDATION_LIMIT, f"{SPEC}.validationDatasetUri", "Vertex's limit")


def _steps(b: SpecBuilder, hp: VertexHyperParameters, sizer: DatasetSizer) -> int | None:
    """Total steps from stepCount, or from epochCount (given or Vertex's default) and the dataset; capped at 500.
    Returns the number of training prompts when the dataset could be counted."""
    if hp.epochCount is not None and hp.stepCount is not None:
        b.problem(f"{HP}.stepCount", "is an alternative to epochCount: set one of them, not both", hp.stepCount)
        return None
    if hp.stepCount is None:
        needed = "epochCount" if hp.epochCount is not None else "the default epochCount"
    elif hp.evaluateInterval is None or hp.checkpointInterval is None:
        needed = "the default evaluateInterval/checkpointInterval (once per epoch)"
    else:
        needed = None
    prompts = training_prompts(
        b,
        sizer,
        f"{SPEC}.trainingDatasetUri",
        needed,
        "or set stepCount, evaluateInterval and checkpointInterval",
        f"{SPEC}.validationDatasetUri",
    )
    batch = hp.batchSize
    if hp.stepCount is not None:
        field, steps, origin, note = f"{HP}.stepCount", hp.stepCount, "user", f"stepCount {hp.stepCount}"
        if prompts:
            b.derived(
                "training.epochs",
                hp.stepCount * batch / prompts,
                f"stepCount × batchSize / prompts = {hp.stepCount} × {batch} / {prompts}",
                field,
            )
    elif prompts is None:
        return None
    else:
        field = f"{HP}.epochCount"
        if hp.epochCount is not None:
            epochs = exact(hp.epochCount)
            b.user("training.epochs", hp.epochCount, field)
        else:
            epochs = vertex_default_epochs(batch, prompts)
            b.derived(
                "training.epochs",
                float(epochs),
                f"Vertex default min(110 × batchSize / prompts, 10) = min(110 × {batch} / {prompts}, 10)",
                field,
            )
        steps, origin = steps_for_epochs(epochs, prompts, batch), "derived"
        note = f"ceil(epochs × prompts / batchSize) = ceil({fmt(epochs)} × {prompts} / {batch}) = {steps}"
    if steps > MAX_STEPS:
        b.warn(field, f"gives {steps} steps; Vertex caps a run at {MAX_STEPS}, so the job runs {MAX_STEPS}")
        steps, origin, note = MAX_STEPS, "derived", f"{note}, capped at {MAX_STEPS}"
        if prompts:  # the epochs trained, not the ones asked for
            b.derived(
                "training.epochs",
                MAX_STEPS * batch / prompts,
                f"capped at {MAX_STEPS} steps: {MAX_STEPS} × batchSize / prompts = {MAX_STEPS} × {batch} / {prompts}",
                field,
            )
    b.set("training.total_steps", steps, origin, field, None if origin == "user" else note)
    return prompts


def _intervals(b: SpecBuilder, hp: VertexHyperParameters, prompts: int | None) -> None:
    if "training.total_steps" not in b.values:
        return
    total = b.values["training.total_steps"]
    per_epoch = min(steps_per_epoch(prompts, hp.batchSize), total) if prompts else None
    note = f"once per epoch: ceil(prompts / batchSize) = ceil({prompts} / {hp.batchSize})" if prompts else None
    for path, name in (("evaluation.interval", "evaluateInterval"), ("checkpoint.interval", "checkpointInterval")):
        if was_set(hp, name):
            b.user(path, getattr(hp, name), f"{HP}.{name}")
        elif per_epoch is not None:
            b.derived(
                path,
                per_epoch,
                note + (f", at most the run's {total} steps" if per_epoch == total else ""),
                f"{HP}.{name}",
            )
    evaluate, checkpoint = b.values.get("evaluation.interval"), b.values.get("checkpoint.interval")
    if evaluate and checkpoint and checkpoint % evaluate:
        b.warn(
            f"{HP}.checkpointInterval",
            f"is not a multiple of evaluateInterval ({evaluate}): Vertex recommends "
            "checkpointInterval = evaluateInterval × N, so that every checkpoint has a fresh evaluation",
            checkpoint,
        )


def _reward(b: SpecBuilder, rts: VertexTuningSpec) -> None:
    single, composite = rts.singleRewardConfig, rts.compositeRewardConfig
    if single is not None and composite is not None:
        b.problem(f"{SPEC}.compositeRewardConfig", "is an alternative to singleRewardConfig: set one of them")
        return
    if single is None and composite is None:
        b.problem(SPEC, "names no reward: set singleRewardConfig or compositeRewardConfig")
        return
    if single is not None:
        config = build_reward(b, VertexReward, f"{SPEC}.singleRewardConfig", single=single)
        field = f"{SPEC}.singleRewardConfig"
    else:
        config = build_reward(b, VertexReward, f"{SPEC}.compositeRewardConfig", composite=composite)
        field = f"{SPEC}.compositeRewardConfig"
    if config is not None:
        b.user("reward.function", config, field)
        _default_autorater_prompts(b, config, field)


def _default_autorater_prompts(b: SpecBuilder, config: VertexReward, field: str) -> None:
    """A warning at each autorater without ``autoraterPrompt``: its judge gets OpenRFT's default prompt."""
    parts = [(field, config.single)] if config.single is not None else []
    if config.composite is not None:
        parts = [
            (f"{field}.weightedRewardConfigs[{i}].rewardConfig", part.rewardConfig)
            for i, part in enumerate(config.composite.weightedRewardConfigs)
        ]
    for where, single in parts:
        if single is not None and single.autoraterScorer is not None and single.autoraterScorer.autoraterPrompt is None:
            b.warn(
                f"{where}.autoraterScorer.autoraterPrompt",
                "is not set: the judge gets OpenRFT's default prompt (docs/rewards.md, 'Vertex AI rewards'); "
                "Vertex does not publish the prompt its service uses",
            )


register(
    Dialect(
        "vertex",
        lambda document: (
            isinstance(document, dict)
            and ("reinforcementTuningSpec" in document or "reinforcement_tuning_spec" in document)
        ),
        lambda document, base_dir, source, _files, sizer: parse_request(document, base_dir, source, sizer),
        DocumentFields(
            train="reinforcementTuningSpec.trainingDatasetUri",
            validation="reinforcementTuningSpec.validationDatasetUri",
            model="baseModel",
            reward="reinforcementTuningSpec",
            output="outputUri",
            tracking="labels",
            replicas="openrft.replicas",
            display_name="tunedModelDisplayName",
            user_metadata="labels",
        ),
        order=20,
    )
)
