"""Tenants' quotas of CPU- and GPU-seconds and what their jobs used (docs/scaling.md, "Quotas of CPU- and GPU-seconds").

A job attempt's use is what it reserved (its placement group's CPUs and GPUs on the server's Ray cluster, its GPUs
of the workers' machine, else ``runtime.threads`` CPUs) times how long it ran: ``start_usage`` when its worker
starts it, ``touch_usage`` at each heartbeat and when it ends. The Tinker API's calls are added as rows of their
own (``add_usage``: their time on the host, measured in tinker/metering.py). A quota counts the use since it was set
or reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import case, func, select, tuple_, update

from openrft.service.store.base import Repo, now
from openrft.service.store.models import JobUsage, TenantQuota

EVERY_TENANT = "*"  # the quota row of tenants without one of their own


@dataclass(frozen=True)
class Quota:
    owner: str  # whose row it is: the tenant's own, or EVERY_TENANT's
    cpu_seconds: float | None  # None: no limit
    gpu_seconds: float | None
    since: float


@dataclass(frozen=True)
class Used:
    cpu_seconds: float
    gpu_seconds: float


class UsageRepo(Repo):
    def set_quota(self, owner: str, cpu_seconds: float | None, gpu_seconds: float | None, reset: bool = False) -> None:
        """The operator's quota of ``owner`` (``*``: every tenant without its own); ``reset`` counts use from now."""
        t = now()
        with self.session() as s:
            row = s.get(TenantQuota, owner)
            if row is None:
                row = TenantQuota(owner=owner, since=0.0)
                s.add(row)
            row.cpu_seconds, row.gpu_seconds, row.updated_at = cpu_seconds, gpu_seconds, t
            if reset:
                row.since = t

    def remove_quota(self, owner: str) -> bool:
        with self.session() as s:
            row = s.get(TenantQuota, owner)
            if row is None:
                return False
            s.delete(row)
            return True

    def quotas(self) -> list[Quota]:
        with self.session() as s:
            rows = s.scalars(select(TenantQuota).order_by(TenantQuota.owner))
            return [Quota(r.owner, r.cpu_seconds, r.gpu_seconds, r.since) for r in rows]

    def quota_for(self, owner: str) -> Quota | None:
        """``owner``'s own quota, else every tenant's, else None (no limit)."""
        with self.session() as s:
            rows = {
                r.owner: r for r in s.scalars(select(TenantQuota).where(TenantQuota.owner.in_([owner, EVERY_TENANT])))
            }
        row = rows.get(owner) or rows.get(EVERY_TENANT)
        return None if row is None else Quota(row.owner, row.cpu_seconds, row.gpu_seconds, row.since)

    def used(self, owner: str, since: float = 0.0) -> Used:
        """CPU- and GPU-seconds ``owner``'s job attempts reserved since ``since``."""
        start = case((JobUsage.started_at > since, JobUsage.started_at), else_=since)
        seconds = JobUsage.last_seen - start
        with self.session() as s:
            cpu, gpu = s.execute(
                select(
                    func.coalesce(func.sum(JobUsage.cpu * seconds), 0.0),
                    func.coalesce(func.sum(JobUsage.gpu * seconds), 0.0),
                ).where(JobUsage.owner == owner, JobUsage.last_seen > since)
            ).one()
        return Used(float(cpu), float(gpu))

    def tenants_with_usage(self) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(JobUsage.owner).distinct().order_by(JobUsage.owner)))

    def start_usage(self, job_id: str, attempt: int, owner: str, cpu: float, gpu: float) -> None:
        t = now()
        with self.session() as s:
            if s.get(JobUsage, (job_id, attempt)) is None:
                s.add(
                    JobUsage(job_id=job_id, attempt=attempt, owner=owner, cpu=cpu, gpu=gpu, started_at=t, last_seen=t)
                )

    def add_usage(self, rows: Sequence[tuple[str, str, float, float, float]]) -> None:
        """Use measured elsewhere (the Tinker API's calls: tinker/metering.py), one row each ``(id, owner, CPUs,
        GPUs, seconds)``: ``seconds`` up to now, so a quota counts it as a job attempt's."""
        if not rows:
            return
        t = now()
        with self.session() as s:
            s.add_all(
                JobUsage(job_id=key, attempt=0, owner=owner, cpu=cpu, gpu=gpu, started_at=t - seconds, last_seen=t)
                for key, owner, cpu, gpu, seconds in rows
            )

    def touch_usage(self, attempts: Sequence[tuple[str, int]]) -> None:
        """The attempts are still running (or just ended): their time counts up to now."""
        if not attempts:
            return
        with self.session() as s:
            s.execute(
                update(JobUsage)
                .where(tuple_(JobUsage.job_id, JobUsage.attempt).in_(list(attempts)))
                .values(last_seen=now())
            )

    def reserved_now(self, job_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
        """(CPUs, GPUs) of the newest attempt of each of ``job_ids`` that has one."""
        if not job_ids:
            return {}
        with self.session() as s:
            rows = s.execute(
                select(JobUsage.job_id, JobUsage.cpu, JobUsage.gpu)
                .where(JobUsage.job_id.in_(list(job_ids)))
                .order_by(JobUsage.attempt)
            ).all()
        return {job_id: (cpu, gpu) for job_id, cpu, gpu in rows}
