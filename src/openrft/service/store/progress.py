"""What a running job reports: events, per-step metrics (one row per step), checkpoints.

A resumed run replays the steps after its checkpoint, so every write here is keyed by step:
``truncate_after`` drops what a dead attempt recorded past the checkpoint, and ``record_step``
replaces a step's metrics row and metrics event rather than adding a second one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update

from openrft.service.store.base import Repo, now, now_s
from openrft.service.store.models import Checkpoint, Event, Job, Sample, StepMetrics


@dataclass
class CheckpointRecord:
    step: int
    path: str
    val_reward: float | None
    metrics: dict[str, Any]


class ProgressRepo(Repo):
    def add_event(
        self,
        job_id: str,
        level: str,
        message: str,
        type: str = "message",
        data: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> None:
        with self.session() as s:
            s.add(
                Event(
                    job_id=job_id,
                    created_at=now_s(),
                    level=level,
                    type=type,
                    message=message,
                    data=data or {},
                    step=step,
                )
            )

    def list_events(self, job_id: str, after: int | None = None, limit: int = 20) -> tuple[list[Event], bool]:
        """Newest first, like OpenAI; ``after`` is the sequence number of the last event already seen."""
        with self.session() as s:
            query = select(Event).where(Event.job_id == job_id)
            if after is not None:
                query = query.where(Event.seq < after)
            rows = list(s.scalars(query.order_by(Event.seq.desc()).limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def events_since(self, job_id: str, since: int, limit: int = 1000) -> list[Event]:
        """Oldest first, events newer than sequence ``since`` (for following a job)."""
        with self.session() as s:
            query = select(Event).where(Event.job_id == job_id, Event.seq > since).order_by(Event.seq).limit(limit)
            return list(s.scalars(query))

    def record_step(
        self, job_id: str, step: int, metrics: dict[str, float], event_data: dict[str, Any], message: str
    ) -> None:
        with self.session() as s:
            s.execute(delete(StepMetrics).where(StepMetrics.job_id == job_id, StepMetrics.step == step))
            s.execute(delete(Event).where(Event.job_id == job_id, Event.type == "metrics", Event.step == step))
            s.add(StepMetrics(job_id=job_id, step=step, created_at=now_s(), data=metrics))
            s.add(
                Event(
                    job_id=job_id,
                    created_at=now_s(),
                    level="info",
                    type="metrics",
                    message=message,
                    data=event_data,
                    step=step,
                )
            )
            s.execute(
                update(Job).where(Job.id == job_id, Job.last_step < step).values(last_step=step, updated_at=now())
            )

    def truncate_after(self, job_id: str, step: int) -> None:
        """Forget metrics (rows and events) and samples past ``step``: the run resumes from its checkpoint there."""
        with self.session() as s:
            s.execute(delete(StepMetrics).where(StepMetrics.job_id == job_id, StepMetrics.step > step))
            s.execute(delete(Sample).where(Sample.job_id == job_id, Sample.step > step))
            s.execute(delete(Event).where(Event.job_id == job_id, Event.type == "metrics", Event.step > step))
            s.execute(update(Job).where(Job.id == job_id).values(last_step=step))

    def metrics(self, job_id: str) -> list[StepMetrics]:
        with self.session() as s:
            return list(s.scalars(select(StepMetrics).where(StepMetrics.job_id == job_id).order_by(StepMetrics.step)))

    def trained_tokens(self, job_id: str) -> int:
        rows = self.metrics(job_id)
        return int(sum(r.data.get("perf/throughput", 0.0) * r.data.get("perf/time_per_step", 0.0) for r in rows))

    def sync_checkpoints(self, job_id: str, records: list[CheckpointRecord]) -> None:
        """Mirror the run directory's checkpoints (the engine prunes all but the best few)."""
        steps = {r.step for r in records}
        with self.session() as s:
            existing = {c.step: c for c in s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id))}
            for step, row in existing.items():
                if step not in steps:
                    s.delete(row)
            for record in records:
                row = existing.get(record.step)
                if row is None:
                    s.add(
                        Checkpoint(
                            id=checkpoint_id(job_id, record.step),
                            job_id=job_id,
                            step=record.step,
                            created_at=now_s(),
                            path=record.path,
                            val_reward=record.val_reward,
                            metrics=record.metrics,
                        )
                    )
                else:
                    row.path, row.val_reward, row.metrics = record.path, record.val_reward, record.metrics

    def best_checkpoints(self, job_id: str, limit: int = 3) -> list[Checkpoint]:
        """Best first by validation reward (unevaluated last), later step first among equals."""
        with self.session() as s:
            query = (
                select(Checkpoint)
                .where(Checkpoint.job_id == job_id)
                .order_by(Checkpoint.val_reward.is_(None), Checkpoint.val_reward.desc(), Checkpoint.step.desc())
                .limit(limit)
            )
            return list(s.scalars(query))

    def count_events(self, job_id: str) -> int:
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(Event).where(Event.job_id == job_id)) or 0


def checkpoint_id(job_id: str, step: int) -> str:
    return f"ftckpt-{job_id.removeprefix('ftjob-')}-{step}"
