"""What the dashboard shows, read from the job store: job summaries with their latest rewards, a job's
metric rows, events and checkpoints."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from openrft.charts import CHARTS, TINKER_CHARTS, VALIDATION_PREFIX, charts_data, overlaid
from openrft.engine.mlflow_tracking import flatten
from openrft.rewards.types import ERROR_KINDS
from openrft.service.store import Store
from openrft.service.store.models import Checkpoint, Event, Job, StepMetrics
from openrft.service.views import queue_reason, resources

TRAIN_REWARD = "critic/rewards/mean"
ACTIVE_STATUSES = ("validating_files", "queued", "running", "pausing")


def latest_rewards(store: Store, job_id: str) -> tuple[float | None, float | None]:
    """(train, validation) reward of the latest steps that have them; rows are read newest first and only
    until both are found (validation runs every few steps)."""
    train = validation = None
    query = (
        select(StepMetrics.data)
        .where(StepMetrics.job_id == job_id)
        .order_by(StepMetrics.step.desc())
        .execution_options(yield_per=32)
    )
    with store.session() as s:
        for data in s.scalars(query):
            if train is None and TRAIN_REWARD in data:
                train = data[TRAIN_REWARD]
            if validation is None:
                validation = next((v for k, v in data.items() if k.startswith(VALIDATION_PREFIX)), None)
            if train is not None and validation is not None:
                break
    return train, validation


def job_summary_name(job: Job) -> str | None:
    return job.display_name or job.suffix or (job.spec or {}).get("name")


def job_summary(store: Store, job: Job, cluster: str | None = None) -> dict[str, Any]:
    """``cluster``: the server's Ray cluster (``--ray-address``), for what the job asks for (``resources``)."""
    train, validation = latest_rewards(store, job.id)
    asked = resources(job, cluster)
    return {
        "id": job.id,
        "name": job_summary_name(job),
        "status": job.status,
        "control": job.control,
        "dialect": job.api,
        "model": job.model,
        "step": job.last_step,
        "total_steps": job.total_steps,
        "train_reward": train,
        "validation_reward": validation,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "error": job.error_message,
        "active": job.status in ACTIVE_STATUSES,
        "resources": asked.model_dump() if asked is not None else None,
        "queue_reason": queue_reason(job),
    }


def metric_rows(store: Store, job_id: str) -> list[dict[str, Any]]:
    return [{"step": r.step, **r.data} for r in store.metrics(job_id)]


def events_after(store: Store, job_id: str, after: int, limit: int = 500) -> list[dict[str, Any]]:
    """Oldest first, the events newer than sequence number ``after``."""
    with store.session() as s:
        rows = s.scalars(
            select(Event).where(Event.job_id == job_id, Event.seq > after).order_by(Event.seq).limit(limit)
        )
        return [
            {"seq": e.seq, "created_at": e.created_at, "level": e.level, "type": e.type, "message": e.message}
            for e in rows
        ]


def checkpoints(store: Store, job_id: str) -> list[dict[str, Any]]:
    """Every kept checkpoint, by step, with its validation reward (no server paths: tenants see ids)."""
    with store.session() as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
        return [{"id": c.id, "step": c.step, "val_reward": c.val_reward, "created_at": c.created_at} for c in rows]


def job_page(store: Store, job: Job, after_event: int, cluster: str | None = None) -> dict[str, Any]:
    """Everything the job page draws: the summary (with the resources the job asks for where the server places
    it), each chart's series (``openrft.charts``: the same series ``openrft plot`` draws), checkpoints, and the
    events after ``after_event``."""
    rows = metric_rows(store, job.id)
    return {
        "job": job_summary(store, job, cluster),
        "charts": [c.to_json() for c in charts_data(rows, TINKER_CHARTS if job.api == "tinker" else CHARTS)],
        "checkpoints": checkpoints(store, job.id),
        "events": events_after(store, job.id, after_event),
    }


def samples_overview(store: Store, job_id: str) -> dict[str, Any]:
    """What the samples view offers to choose from: each recorded (kind, step) with its count, mean reward and
    errors, the graders that scored them, the error kinds."""
    return {
        "steps": store.sample_steps(job_id),
        "graders": store.sample_graders(job_id),
        "error_kinds": list(ERROR_KINDS),
    }


HIDDEN_SETTINGS = ("metadata", "output_dir", "data.train", "data.validation")
"""Left out of the settings shown side by side: the server's paths of the datasets and outputs, and metadata."""


def settings(job: Job) -> dict[str, str]:
    """A job's resolved spec as flat ``section.field`` settings (as MLflow gets them as params)."""
    flat = flatten(job.spec or {})
    return {k: v for k, v in flat.items() if k not in HIDDEN_SETTINGS and not k.startswith("metadata.")}


def comparison(store: Store, jobs: list[Job]) -> dict[str, Any]:
    """Two or more jobs: their summaries, every chart with each job's lines on the same axes, and their settings
    side by side (the ones that differ first)."""
    names = [f"{job_summary_name(job)} ({job.id[-6:]})" for job in jobs]
    runs = [(name, metric_rows(store, job.id)) for name, job in zip(names, jobs)]
    per_job = [settings(job) for job in jobs]
    keys = sorted({k for s in per_job for k in s})
    rows = [{"name": k, "values": [s.get(k) for s in per_job]} for k in keys]
    for row in rows:
        row["differs"] = len(set(row["values"])) > 1
    rows.sort(key=lambda r: not r["differs"])  # stable: the differing settings first, each group by name
    return {
        "jobs": [{**job_summary(store, job), "label": name} for name, job in zip(names, jobs)],
        "charts": [c.to_json() for c in overlaid(runs)],
        "settings": rows,
    }
