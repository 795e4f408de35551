"""Tinker training clients in the job store, so the dashboard lists them beside the jobs (``dialect``
``tinker``), each under its API key's tenant: one job row per training model (``running`` while it
lives), a metrics row per ``optim_step``, a checkpoint row per saved state or named sampler weights.

The dialect routes (OpenAI, Vertex, Nova) do not list these rows (``list_jobs`` leaves them out unless
asked): they are no fine-tuning jobs a worker could run. A server that stops leaves its rows ``running``;
the next one marks them ``paused``, naming the newest saved state to resume from
(``create_training_client_from_state_with_optimizer``).
"""

from __future__ import annotations

import hashlib
import uuid

from sqlalchemy import select, update

from openrft.service.store import Store
from openrft.service.store.base import now, now_s
from openrft.service.store.models import Checkpoint, Event, Job

API = "tinker"


def _event(job_id: str, message: str, level: str = "info") -> Event:
    return Event(job_id=job_id, created_at=now_s(), level=level, type="message", message=message, data={})


class SessionRecords:
    def __init__(self, store: Store):
        self.store = store

    def started(
        self,
        owner: str,
        model_id: str,
        base_model: str,
        lora: dict,
        source: str | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> str:
        """A job row for a new training model (``user_metadata`` as the SDK's training run shows it); its job id."""
        job_id = "tinker-" + uuid.uuid4().hex[:24]
        how = f"from {source}" if source else f"on {base_model}"
        spec = {"name": model_id, "model": base_model, "lora": lora, "tinker": {"model_id": model_id, "from": source}}
        job = Job(
            id=job_id,
            owner=owner,
            api=API,
            status="running",
            request={"model_id": model_id, "base_model": base_model, "lora_config": lora, "from": source},
            spec=spec,
            model=base_model,
            display_name=model_id,
            total_steps=0,
            started_at=now_s(),
            user_metadata=user_metadata or None,
        )
        self.store.create_job(job, f"Tinker training client {model_id} {how} (LoRA rank {lora['rank']})")
        return job_id

    def step(self, job_id: str, step: int, metrics: dict[str, float]) -> None:
        summary = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self.store.record_step(job_id, step, metrics, {"step": step, **metrics}, f"Step {step}: {summary}")
        with self.store.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(total_steps=step))

    def checkpoint(self, job_id: str, step: int, tinker_path: str, kind: str) -> None:
        checkpoint_id = "tkckpt-" + hashlib.sha256(tinker_path.encode()).hexdigest()[:32]
        with self.store.session() as s:
            row = s.get(Checkpoint, checkpoint_id)
            if row is not None:
                s.delete(row)
                s.flush()
            s.add(
                Checkpoint(
                    id=checkpoint_id,
                    job_id=job_id,
                    step=step,
                    created_at=now_s(),
                    path=tinker_path,
                    val_reward=None,
                    metrics={"kind": kind},
                )
            )
            s.add(_event(job_id, f"Saved {kind} {tinker_path} at step {step}"))

    def ended(self, job_id: str, status: str, message: str) -> None:
        with self.store.session() as s:
            done = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == "running")
                .values(status=status, finished_at=now_s(), updated_at=now())
            )
            if done.rowcount == 1:
                s.add(_event(job_id, message))

    def orphaned(self) -> list[str]:
        """Rows a stopped server left ``running``: now ``paused``, with the saved state to resume from."""
        with self.store.session() as s:
            jobs = list(s.scalars(select(Job).where(Job.api == API, Job.status == "running")))
            for job in jobs:
                newest = s.scalar(
                    select(Checkpoint.path)
                    .where(Checkpoint.job_id == job.id, Checkpoint.path.contains("/weights/"))
                    .order_by(Checkpoint.created_at.desc(), Checkpoint.step.desc())
                    .limit(1)
                )
                job.status, job.updated_at = "paused", now()
                hint = (
                    f"resume it with create_training_client_from_state_with_optimizer({newest!r})"
                    if newest
                    else "it saved no state to resume from"
                )
                s.add(_event(job.id, f"The server restarted and this training client is gone; {hint}"))
        return [job.id for job in jobs]
