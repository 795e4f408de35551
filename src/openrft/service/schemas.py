"""The API's request and response shapes (OpenAI fine-tuning objects, Vertex tuning jobs).

Pure pydantic, no server imports: the SDK (``openrft.client``) parses responses with these too.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from openrft.data.validation import check_messages
from openrft.spec.document_limits import DocumentLimitError, check_document

T = TypeVar("T")

JobStatus = Literal["validating_files", "queued", "running", "pausing", "paused", "succeeded", "failed", "cancelled"]


class _Open(BaseModel):
    """Responses keep fields a newer server adds."""

    model_config = ConfigDict(extra="allow")


# OpenAI objects -------------------------------------------------------------------------------------------


class ErrorObject(_Open):
    code: str | None = None
    message: str
    param: str | None = None


class FileObject(_Open):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(_Open):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class JobResources(_Open):
    """OpenRFT: what a job will ask for, computed from its spec and the server's settings before it starts."""

    runtime: Literal["local", "ray"] = Field(
        description="where its learners run: ray (Ray actors, on the server's cluster when ray_address_set) or "
        "local (the job's own process on the worker)"
    )
    learners: int = Field(description="learner processes: rollout.replicas Ray actors, or 1 in the job's process")
    generation_replicas: int = Field(
        description="generation actors on Ray (0 where the learners sample or servers generate; a local job's "
        "replica threads are not counted)"
    )
    cpu: float | None = Field(
        description="CPUs reserved: the placement group's sum (runtime.threads per bundle, 1 when unset); "
        "null: a local job uses the worker's cores"
    )
    gpu: float | None = Field(
        description="GPUs reserved; null: decided when it starts (runtime.device auto takes one GPU per bundle "
        "where the cluster has one for every bundle)"
    )
    ray_address_set: bool = Field(description="the server runs jobs on its Ray cluster (--ray-address)")
    bundles: list[dict[str, float]] = Field(
        default_factory=list, description="the Ray placement group, one bundle per learner then per generation actor"
    )


class FineTuningJob(_Open):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None = None
    estimated_finish: int | None = None
    error: ErrorObject | None = None
    fine_tuned_model: str | None = None
    model: str
    organization_id: str = "org-openrft"
    status: JobStatus
    trained_tokens: int | None = None
    training_file: str | None = None
    validation_file: str | None = None
    seed: int | None = None
    suffix: str | None = None
    metadata: dict[str, str] | None = None
    method: dict[str, Any] = Field(default_factory=dict)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    result_files: list[str] = Field(default_factory=list)
    integrations: list[dict[str, Any]] = Field(default_factory=list)
    step: int = Field(0, description="OpenRFT: the last step with recorded metrics")
    total_steps: int = Field(0, description="OpenRFT: steps the job runs in all")
    resources: JobResources | None = Field(
        None, description="OpenRFT: the resources the job will ask for (null: a Tinker session's job)"
    )
    queue_reason: str | None = Field(
        None,
        description="OpenRFT: what a queued job waits for on the server's Ray cluster (e.g. 'waiting for resources on "
        "the Ray cluster: 2 CPU, 1 free') or for its tenant's quota ('tenant quota: 3600 CPU-seconds used of 3600'); "
        "null when it is not waiting for either",
    )
    priority: int = Field(
        0, description="OpenRFT: its order among its tenant's queued jobs, higher first (openrft.priority)"
    )


class JobEvent(_Open):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"] = "message"
    data: dict[str, Any] = Field(default_factory=dict)


class JobCheckpoint(_Open):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    step_number: int
    metrics: dict[str, Any] = Field(default_factory=dict)


class Page(_Open, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


# OpenAI requests ------------------------------------------------------------------------------------------


class JobCreateRequest(BaseModel):
    """``POST /v1/fine_tuning/jobs``: checked in full by the OpenAI dialect (errors name the field)."""

    model_config = ConfigDict(extra="allow")

    model: str
    training_file: str
    validation_file: str | None = None
    seed: int | None = None
    suffix: str | None = Field(None, max_length=64)
    metadata: dict[str, str] | None = None
    method: dict[str, Any] | None = None
    hyperparameters: dict[str, Any] | None = None


CODED_ERRORS = ("document_too_complex", "invalid_item")
"""Error types of the validators below; the API answers them as 400 with that code (``service/errors.py``),
the ``message`` and ``param`` of the error's context."""


def _bounded(what: str) -> AfterValidator:
    """A request's document within the bounds of ``spec/document_limits.py`` (depth, expanded size)."""

    def check(document: Any) -> Any:
        try:
            check_document(document, what)
        except DocumentLimitError as exc:
            raise PydanticCustomError("document_too_complex", "{message}", {"message": str(exc)}) from None
        return document

    return AfterValidator(check)


def _checked_item(item: Any) -> Any:
    """A grader's item with its ``messages`` (when it has them) checked and normalised as a dataset line's."""
    if not isinstance(item, dict) or "messages" not in item:
        return item
    messages, problems = check_messages(item["messages"])
    if problems:
        message = "item.messages: " + "; ".join(f"{f}: {m}" for f, m in problems)
        raise PydanticCustomError("invalid_item", "{message}", {"message": message, "param": "item.messages"})
    return {**item, "messages": messages}


class GraderRunRequest(BaseModel):
    grader: Annotated[dict[str, Any], _bounded("grader")]
    model_sample: str
    item: Annotated[Any, _bounded("item"), AfterValidator(_checked_item)] = None
    reference_answer: Any = None


class GraderValidateRequest(BaseModel):
    grader: Annotated[dict[str, Any], _bounded("grader")]


# Vertex objects ---------------------------------------------------------------------------------------------

VertexState = Literal[
    "JOB_STATE_QUEUED",
    "JOB_STATE_PENDING",
    "JOB_STATE_RUNNING",
    "JOB_STATE_SUCCEEDED",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLING",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_PAUSED",
]


class GoogleStatus(_Open):
    code: int
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class TunedModel(_Open):
    model: str | None = None
    endpoint: str | None = None
    checkpoints: list[dict[str, Any]] = Field(default_factory=list)


class TuningJob(_Open):
    name: str
    tunedModelDisplayName: str | None = None
    description: str | None = None
    baseModel: str
    state: VertexState
    createTime: str
    startTime: str | None = None
    endTime: str | None = None
    updateTime: str
    error: GoogleStatus | None = None
    reinforcementTuningSpec: dict[str, Any] | None = None
    tunedModel: TunedModel | None = None
    labels: dict[str, str] | None = None
    resources: JobResources | None = Field(
        None, description="OpenRFT: the resources the job will ask for, as on the OpenAI job object"
    )
    queueReason: str | None = Field(None, description="OpenRFT: what a queued job waits for, as queue_reason")
    priority: int = Field(0, description="OpenRFT: its order among its tenant's queued jobs, as on the OpenAI job")


class TuningJobList(_Open):
    tuningJobs: list[TuningJob] = Field(default_factory=list)
    nextPageToken: str | None = None


class TuningJobCreateRequest(BaseModel):
    """``POST .../tuningJobs``: checked in full by the Vertex dialect."""

    model_config = ConfigDict(extra="allow")

    baseModel: str
    tunedModelDisplayName: str | None = None
    description: str | None = None
    labels: dict[str, str] | None = None
    reinforcementTuningSpec: dict[str, Any]


class ValidateRewardRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    sampleResponse: dict[str, Any]
    example: dict[str, Any]
    singleRewardConfig: Annotated[dict[str, Any], _bounded("singleRewardConfig")] | None = None
    compositeRewardConfig: Annotated[dict[str, Any], _bounded("compositeRewardConfig")] | None = None
