"""A job's recorded samples (``engine/samples.py``) in the store: added as the job records them, kept under the
job's ``tracking.samples_max_mb`` (the oldest dropped first, like the run directory's files), read back a page
at a time with filters and an order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select

from openrft.engine.samples import SampleOrder
from openrft.service.store.base import Repo
from openrft.service.store.models import Sample


@dataclass
class SampleFilter:
    kind: str | None = None
    step: int | None = None
    example_id: str | None = None
    error_kind: str | None = None  # "any": every failed sample
    grader: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None


def _row(job_id: str, record: dict[str, Any]) -> Sample:
    size = len(json.dumps(record, ensure_ascii=False).encode())
    return Sample(
        job_id=job_id,
        kind=record["kind"],
        step=record["step"],
        example_id=str(record["example_id"])[:200],
        reward=record.get("reward"),
        advantage=record.get("advantage"),
        error_kind=record.get("error_kind"),
        graders="|" + "|".join(record.get("graders") or {}) + "|",
        bytes=size,
        data=record,
    )


class SamplesRepo(Repo):
    def add_samples(self, job_id: str, records: list[dict[str, Any]], max_bytes: int) -> None:
        """Store ``records``, then drop the job's oldest samples while they take more than ``max_bytes``."""
        with self.session() as s:
            s.add_all(_row(job_id, r) for r in records)
        with self.session() as s:
            total = s.scalar(select(func.sum(Sample.bytes)).where(Sample.job_id == job_id)) or 0
            if total <= max_bytes:
                return
            over, last = total - max_bytes, None
            for seq, size in s.execute(
                select(Sample.seq, Sample.bytes).where(Sample.job_id == job_id).order_by(Sample.seq)
            ):
                over -= size
                last = seq
                if over <= 0:
                    break
            s.execute(delete(Sample).where(Sample.job_id == job_id, Sample.seq <= last))

    def list_samples(
        self, job_id: str, where: SampleFilter, order: SampleOrder = "step", offset: int = 0, limit: int = 50
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of the job's sample records and whether more follow; ``step`` order is the recording order."""
        query = select(Sample.data).where(Sample.job_id == job_id)
        if where.kind is not None:
            query = query.where(Sample.kind == where.kind)
        if where.step is not None:
            query = query.where(Sample.step == where.step)
        if where.example_id is not None:
            query = query.where(Sample.example_id == where.example_id)
        if where.error_kind == "any":
            query = query.where(Sample.error_kind.is_not(None))
        elif where.error_kind is not None:
            query = query.where(Sample.error_kind == where.error_kind)
        if where.grader is not None:
            query = query.where(Sample.graders.contains(f"|{where.grader}|", autoescape=True))
        if where.min_reward is not None:
            query = query.where(Sample.reward >= where.min_reward)
        if where.max_reward is not None:
            query = query.where(Sample.reward <= where.max_reward)
        column = {"step": Sample.seq, "reward": Sample.reward, "advantage": Sample.advantage}[order.lstrip("-")]
        descending = order.startswith("-")
        keys = [column.is_(None), column.desc() if descending else column]  # samples without a value last
        query = query.order_by(*keys, Sample.seq)  # ties in recording order, as ``engine.samples.ordered``
        with self.session() as s:
            rows = list(s.scalars(query.offset(offset).limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def sample_steps(self, job_id: str) -> list[dict[str, Any]]:
        """Each (kind, step) that has samples: how many, their mean reward, how many failed."""
        query = (
            select(
                Sample.kind,
                Sample.step,
                func.count(),
                func.avg(Sample.reward),
                func.count(Sample.error_kind),
            )
            .where(Sample.job_id == job_id)
            .group_by(Sample.kind, Sample.step)
            .order_by(Sample.kind, Sample.step)
        )
        with self.session() as s:
            return [
                {"kind": kind, "step": step, "samples": count, "mean_reward": mean, "errors": errors}
                for kind, step, count, mean, errors in s.execute(query)
            ]

    def sample_graders(self, job_id: str) -> list[str]:
        """The names of the graders that appear in the job's samples."""
        with self.session() as s:
            values = s.scalars(select(Sample.graders).where(Sample.job_id == job_id).distinct())
            return sorted({name for value in values for name in value.strip("|").split("|") if name})
