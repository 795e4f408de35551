"""Stored rows -> the objects each API returns (OpenAI fine-tuning objects, Vertex tuning jobs)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from openrft.runtime.placement import job_resources
from openrft.service.schemas import (
    ErrorObject,
    FileObject,
    FineTuningJob,
    GoogleStatus,
    JobCheckpoint,
    JobEvent,
    JobResources,
    TunedModel,
    TuningJob,
)
from openrft.service.store.models import Checkpoint, Event, Job, StoredFile
from openrft.spec.job import JobSpec

VERTEX_STATES = {
    "validating_files": "JOB_STATE_PENDING",
    "queued": "JOB_STATE_QUEUED",
    "running": "JOB_STATE_RUNNING",
    "pausing": "JOB_STATE_RUNNING",
    "paused": "JOB_STATE_PAUSED",
    "succeeded": "JOB_STATE_SUCCEEDED",
    "failed": "JOB_STATE_FAILED",
    "cancelled": "JOB_STATE_CANCELLED",
}
# google.rpc.Code numbers for the error codes a job can fail with
GOOGLE_CODES = {
    "invalid_training_file": 3,
    "invalid_job": 3,
    "model_not_found": 5,
    "worker_lost": 14,
    "ray_actors_lost": 14,
}


def hyperparameters(spec: dict[str, Any]) -> dict[str, Any]:
    """The resolved hyperparameters, under OpenAI's names ("auto" values filled in)."""
    training, optimizer, evaluation = spec["training"], spec["optimizer"], spec["evaluation"]
    return {
        "n_epochs": training.get("epochs") or "auto",
        "batch_size": training["prompts_per_step"],
        "learning_rate_multiplier": optimizer["lr"] / spec["model"]["base_learning_rate"],
        "eval_interval": evaluation["interval"] or training["total_steps"],
        "eval_samples": evaluation["samples_per_prompt"],
        "reasoning_effort": spec["sampling"].get("reasoning_effort") or "default",
        "samples_per_prompt": spec["sampling"]["samples_per_prompt"],
        "total_steps": training["total_steps"],
    }


def _method(job: Job) -> dict[str, Any]:
    hp = hyperparameters(job.spec)
    if job.api == "openai" and isinstance(job.request.get("method"), dict):
        method = copy.deepcopy(job.request["method"])
        section = method.setdefault("reinforcement", {})
        if isinstance(section, dict):
            section["hyperparameters"] = {**(section.get("hyperparameters") or {}), **hp}
        return method
    reward = job.spec["reward"]["function"]
    grader = reward.get("grader") if reward.get("type") == "openai_grader" else None
    return {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}}


def resources(job: Job, cluster: str | None) -> JobResources | None:
    """What ``job`` will ask for where the server places it (``cluster``: the server's --ray-address); None for a
    Tinker session's row, whose spec is not a job's."""
    if job.api == "tinker":
        return None
    try:
        spec = JobSpec.model_validate(job.spec)
    except ValidationError:
        return None
    return JobResources(**job_resources(spec, cluster).as_dict())


def openai_job(job: Job, cluster: str | None = None) -> FineTuningJob:
    """``cluster``: the server's Ray cluster (``ServiceConfig.ray_address``), for the job's ``resources``."""
    error = None
    if job.error_code or job.error_message:
        error = ErrorObject(code=job.error_code, message=job.error_message or "", param=job.error_param)
    return FineTuningJob(
        id=job.id,
        created_at=job.created_at,
        finished_at=job.finished_at,
        error=error,
        fine_tuned_model=job.fine_tuned_model,
        model=job.model,
        organization_id=f"org-{job.owner}",
        status=job.status,  # type: ignore[arg-type]
        trained_tokens=job.trained_tokens,
        training_file=job.training_file,
        validation_file=job.validation_file,
        seed=job.seed,
        suffix=job.suffix,
        metadata=job.user_metadata,
        method=_method(job),
        hyperparameters=hyperparameters(job.spec),
        result_files=job.result_files or [],
        step=job.last_step,
        total_steps=job.total_steps,
        resources=resources(job, cluster),
        queue_reason=queue_reason(job),
        priority=job.priority or 0,
    )


def queue_reason(job: Job) -> str | None:
    """What a queued job waits for (admission on the server's cluster); None once it is not queued."""
    return job.queue_reason if job.status == "queued" else None


def openai_event(event: Event) -> JobEvent:
    return JobEvent(
        id=f"ftevent-{event.seq}",
        created_at=event.created_at,
        level=event.level,  # type: ignore[arg-type]
        message=event.message,
        type=event.type,
        data=event.data or {},
    )  # type: ignore[arg-type]


def event_seq(event_id: str) -> int | None:
    """``ftevent-42`` -> 42; anything else -> None."""
    number = event_id.removeprefix("ftevent-")
    return int(number) if number.isdigit() and len(number) < 19 else None


def checkpoint_model_name(job: Job, step: int) -> str:
    return f"{final_model_name(job)}:ckpt-step-{step}"


def final_model_name(job: Job) -> str:
    """OpenAI's ``ft:MODEL:ORG:SUFFIX:ID`` form, naming the job's final adapter."""
    model = job.model.replace(":", "_")
    return f"ft:{model}:openrft:{job.suffix or ''}:{job.id}"


def openai_checkpoint(checkpoint: Checkpoint, job: Job) -> JobCheckpoint:
    return JobCheckpoint(
        id=checkpoint.id,
        created_at=checkpoint.created_at,
        fine_tuned_model_checkpoint=checkpoint_model_name(job, checkpoint.step),
        fine_tuning_job_id=job.id,
        step_number=checkpoint.step,
        metrics=checkpoint.metrics or {"step": checkpoint.step},
    )


def openai_file(row: StoredFile) -> FileObject:
    return FileObject(id=row.id, bytes=row.bytes, created_at=row.created_at, filename=row.filename, purpose=row.purpose)


def rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def vertex_job(
    job: Job,
    parent: str,
    checkpoints: list[Checkpoint] = (),  # type: ignore[assignment]
    cluster: str | None = None,
) -> TuningJob:
    state = VERTEX_STATES[job.status]
    if job.control == "cancel" and job.status in ("running", "pausing"):
        state = "JOB_STATE_CANCELLING"
    if queue_reason(job):  # waiting for its resources on the server's Ray cluster: Vertex's "preparing to run"
        state = "JOB_STATE_PENDING"
    error = None
    if job.error_code or job.error_message:
        error = GoogleStatus(
            code=GOOGLE_CODES.get(job.error_code or "", 13),
            message=job.error_message or "",
            details=[{"reason": job.error_code, "field": job.error_param}],
        )
    tuned = None
    if job.fine_tuned_model or checkpoints:
        tuned = TunedModel(
            model=job.fine_tuned_model,
            checkpoints=[
                {"checkpointId": str(c.step), "step": str(c.step), "reward": c.val_reward} for c in checkpoints
            ],
        )
    spec = job.request.get("reinforcementTuningSpec") if job.api == "vertex" else None
    return TuningJob(
        name=f"{parent}/tuningJobs/{job.id}",
        tunedModelDisplayName=job.display_name,
        description=job.request.get("description") if job.api == "vertex" else None,
        baseModel=job.model,
        state=state,  # type: ignore[arg-type]
        createTime=rfc3339(job.created_at) or "",
        startTime=rfc3339(job.started_at),
        endTime=rfc3339(job.finished_at),
        updateTime=rfc3339(job.updated_at) or "",
        error=error,
        reinforcementTuningSpec=spec,
        tunedModel=tuned,
        labels=job.user_metadata,
        resources=resources(job, cluster),
        queueReason=queue_reason(job),
        priority=job.priority or 0,
    )
