"""Jobs and their lifecycle: create, list, control requests, atomic claims, heartbeats, the reaper.

Every state change is a conditional UPDATE (``WHERE status = ...``), so two processes racing on the
same job cannot both win. Statuses are the OpenAI ones; the Vertex routes map them to JOB_STATE_*.

Claims go round-robin across tenants: the next job is the oldest queued one of the tenant whose last
claim is the oldest (a tenant never claimed goes first), so one tenant's 500 queued jobs wait their
turn behind another's single job instead of ahead of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, aliased

from openrft.service.store.base import Conflict, NotFound, QuotaExceeded, Repo, now, now_s
from openrft.service.store.models import Event, Job

WAITING = ("validating_files", "queued")
ACTIVE = ("running", "pausing")
TERMINAL = ("succeeded", "failed", "cancelled")
RESUMABLE_ERRORS = ("insufficient_storage",)  # a failed job that continues from its last checkpoint when resumed
STATUSES = ("validating_files", "queued", "running", "pausing", "paused", "succeeded", "failed", "cancelled")


def _event(job_id: str, message: str, level: str = "info") -> Event:
    return Event(job_id=job_id, created_at=now_s(), level=level, type="message", message=message, data={})


def _check_queued(s: Session, owner: str, max_queued: int | None) -> None:
    """QuotaExceeded (429) when ``owner`` already has ``max_queued`` jobs waiting to start."""
    if max_queued is None:
        return
    waiting = s.scalar(select(func.count()).select_from(Job).where(Job.owner == owner, Job.status.in_(WAITING)))
    if waiting >= max_queued:
        raise QuotaExceeded(
            f"this API key has {waiting} jobs queued, the service's limit of {max_queued} queued jobs per API key; "
            "submit more when some have started",
            "queued_jobs_limit",
            429,
        )


class JobsRepo(Repo):
    def create_job(self, job: Job, message: str = "Validated the job; queued", max_queued: int | None = None) -> Job:
        """Store a new job; with ``max_queued``, refused (QuotaExceeded) when its owner has that many waiting."""
        job.created_at = job.created_at or now_s()
        job.updated_at = now()
        job.attempts = 0
        job.last_step = 0
        with self.owner_session(job.owner) as s:
            _check_queued(s, job.owner, max_queued)
            s.add(job)
            s.add(_event(job.id, f"Created fine-tuning job: {job.id}"))
            s.add(_event(job.id, message))
        return job

    def check_queue_room(self, owner: str, max_queued: int | None) -> None:
        """QuotaExceeded now, before a submission is validated, when ``owner`` has no room for another job."""
        with self.session() as s:
            _check_queued(s, owner, max_queued)

    def get_job(self, owner: str | None, job_id: str) -> Job:
        """A job of ``owner`` (None: any owner, for workers); NotFound otherwise."""
        with self.session() as s:
            query = select(Job).where(Job.id == job_id)
            if owner is not None:
                query = query.where(Job.owner == owner)
            job = s.scalar(query)
        if job is None:
            raise NotFound(job_id)
        return job

    def list_jobs(
        self, owner: str, limit: int = 20, after: str | None = None, tinker: bool = False
    ) -> tuple[list[Job], bool]:
        """Newest first; ``after`` is the last job id of the previous page. ``tinker``: Tinker training
        clients too (``service/tinker/records.py``), which the dialect routes do not list."""
        with self.session() as s:
            query = select(Job).where(Job.owner == owner)
            if not tinker:
                query = query.where(Job.api != "tinker")
            if after:
                cursor = s.scalar(select(Job.seq).where(Job.id == after, Job.owner == owner))
                if cursor is None:
                    raise NotFound(after)
                query = query.where(Job.seq < cursor)
            rows = list(s.scalars(query.order_by(Job.seq.desc()).limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def _transition(self, job_id: str, expected: str, message: str | None, level: str = "info", **values: Any) -> bool:
        with self.session() as s:
            result = s.execute(
                update(Job).where(Job.id == job_id, Job.status == expected).values(updated_at=now(), **values)
            )
            if result.rowcount != 1:
                return False
            if message:
                s.add(_event(job_id, message, level))
        return True

    # requests from the API ---------------------------------------------------------------------------

    def request_cancel(self, owner: str, job_id: str) -> Job:
        for _ in range(5):
            job = self.get_job(owner, job_id)
            if job.status in TERMINAL:
                raise Conflict(f"job {job_id} is already {job.status}", "job_not_cancellable")
            if job.status in ACTIVE:
                if job.control == "cancel" or self._transition(
                    job_id, job.status, "Cancellation requested", control="cancel"
                ):
                    return self.get_job(owner, job_id)
            elif self._transition(
                job_id, job.status, "Job cancelled", status="cancelled", control=None, finished_at=now_s()
            ):
                return self.get_job(owner, job_id)
        raise Conflict(f"job {job_id} changed state while being cancelled; try again", "concurrent_update")

    def request_pause(self, owner: str, job_id: str) -> Job:
        for _ in range(5):
            job = self.get_job(owner, job_id)
            if job.status == "running" and job.control != "cancel":
                if self._transition(
                    job_id, "running", "Pause requested: checkpointing", status="pausing", control="pause"
                ):
                    return self.get_job(owner, job_id)
            elif job.status == "queued":
                if self._transition(job_id, "queued", "Job paused", status="paused"):
                    return self.get_job(owner, job_id)
            else:
                raise Conflict(
                    f"job {job_id} is {job.status}: only a running or queued job can be paused", "job_not_pausable"
                )
        raise Conflict(f"job {job_id} changed state while being paused; try again", "concurrent_update")

    def request_resume(self, owner: str, job_id: str, max_queued: int | None = None) -> Job:
        """A paused job, or one that failed on a full disk, queued again (it continues from its last
        checkpoint); with ``max_queued``, counted against its owner's queued jobs."""
        job = self.get_job(owner, job_id)
        resumable = job.status == "paused" or (job.status == "failed" and job.error_code in RESUMABLE_ERRORS)
        if not resumable:
            raise Conflict(
                f"job {job_id} is {job.status}: only a paused job, or one that failed on a full disk, can be resumed",
                "job_not_resumable",
            )
        with self.owner_session(owner) as s:
            _check_queued(s, owner, max_queued)
            resumed = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == job.status, Job.error_code.is_not_distinct_from(job.error_code))
                .values(
                    status="queued",
                    control=None,
                    updated_at=now(),
                    finished_at=None,
                    error_code=None,
                    error_message=None,
                    error_param=None,
                )
            )
            if resumed.rowcount != 1:
                raise Conflict(f"job {job_id} changed state while being resumed; try again", "concurrent_update")
            s.add(_event(job_id, "Job resumed: queued"))
        return self.get_job(owner, job_id)

    # workers ---------------------------------------------------------------------------------------------

    def _next_queued(self, column):
        """The next queued job's ``column``: of the tenant claimed least recently (round-robin; between tenants never
        claimed, the one whose oldest job waits longest), that tenant's job of the highest priority, then the
        oldest. A priority orders a tenant's own jobs only."""
        candidate, other, mine = aliased(Job), aliased(Job), aliased(Job)
        last_claim = (
            select(func.max(other.claimed_at)).where(other.owner == candidate.owner).correlate(candidate)
        ).scalar_subquery()
        tenant_oldest = (
            select(func.min(mine.seq))
            .where(mine.owner == candidate.owner, mine.status == "queued")
            .correlate(candidate)
        ).scalar_subquery()
        return (
            select(getattr(candidate, column))
            .where(candidate.status == "queued")
            .order_by(func.coalesce(last_claim, -1.0), tenant_oldest, candidate.priority.desc(), candidate.seq)
            .limit(1)
        ), candidate

    def queued_heads(self) -> list[Job]:
        """Each tenant's next queued job (its highest priority, then its oldest), in ``claim_job``'s order (the tenant
        claimed least recently first)."""
        order = func.row_number().over(partition_by=Job.owner, order_by=(Job.priority.desc(), Job.seq))
        ranked = select(Job.seq, order.label("place")).where(Job.status == "queued").subquery()
        with self.session() as s:
            heads = list(s.scalars(select(Job).join(ranked, Job.seq == ranked.c.seq).where(ranked.c.place == 1)))
            owners = [h.owner for h in heads]
            claims = dict(
                s.execute(
                    select(Job.owner, func.max(Job.claimed_at)).where(Job.owner.in_(owners)).group_by(Job.owner)
                ).all()
            )
            oldest = dict(
                s.execute(
                    select(Job.owner, func.min(Job.seq))
                    .where(Job.owner.in_(owners), Job.status == "queued")
                    .group_by(Job.owner)
                ).all()
            )
        return sorted(heads, key=lambda job: (claims.get(job.owner) or -1.0, oldest[job.owner]))

    def active_specs(self) -> list[tuple[str, Any]]:
        """(owner, spec) of every running or pausing job: what each tenant holds now."""
        with self.session() as s:
            rows = s.execute(select(Job.owner, Job.spec).where(Job.status.in_(ACTIVE))).all()
        return [(owner, spec) for owner, spec in rows]

    def set_queue_reason(self, job_id: str, reason: str | None) -> None:
        """What a queued job waits for (None: nothing); a new reason is also an event of the job."""
        with self.session() as s:
            changed = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == "queued", func.coalesce(Job.queue_reason, "") != (reason or ""))
                .values(queue_reason=reason)
            ).rowcount
            if changed and reason:
                s.add(_event(job_id, f"Queued: {reason}"))

    def claim_job(self, worker_id: str, job_id: str | None = None) -> Job | None:
        """Take the next queued job (or ``job_id``, if it is still queued), atomically: one UPDATE; PostgreSQL skips
        rows another worker locked. The next job is the oldest of the tenant claimed least recently (round-robin
        across tenants)."""
        t = now()
        nxt, candidate = self._next_queued("seq")
        if job_id is not None:
            nxt = select(candidate.seq).where(candidate.id == job_id, candidate.status == "queued")
        if self.engine.dialect.name == "postgresql":
            nxt = nxt.with_for_update(of=candidate, skip_locked=True)
        with self.session() as s:
            claimed = s.execute(
                update(Job)
                .where(Job.seq == nxt.scalar_subquery(), Job.status == "queued")
                .values(
                    status="running",
                    worker_id=worker_id,
                    heartbeat_at=t,
                    updated_at=t,
                    claimed_at=t,
                    attempts=Job.attempts + 1,
                    control=None,
                    queue_reason=None,
                )
                .returning(Job.id)
            ).scalar()
            if claimed is None:
                return None
            s.execute(update(Job).where(Job.id == claimed, Job.started_at.is_(None)).values(started_at=int(t)))
            s.add(_event(claimed, f"Job started on worker {worker_id}"))
        return self.get_job(None, claimed)

    def heartbeat(self, worker_id: str, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        with self.session() as s:
            s.execute(
                update(Job)
                .where(Job.id.in_(list(job_ids)), Job.worker_id == worker_id, Job.status.in_(ACTIVE))
                .values(heartbeat_at=now())
            )

    def controls(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        with self.session() as s:
            rows = s.execute(select(Job.id, Job.control).where(Job.id.in_(list(job_ids)))).all()
        return dict(rows)  # type: ignore[arg-type]

    def reap_expired(self, timeout_s: float, max_attempts: int) -> list[str]:
        """Jobs whose worker stopped heartbeating: requeued (they resume from their last checkpoint),
        cancelled if a cancel was pending, failed after ``max_attempts`` starts."""
        deadline = now() - timeout_s
        with self.session() as s:
            stale = list(s.scalars(select(Job).where(Job.status.in_(ACTIVE), Job.heartbeat_at < deadline)))
        return self._reap(stale, "stopped heartbeating", max_attempts)

    def workers_holding_jobs(self, prefix: str) -> set[str]:
        """The ids of the workers starting with ``prefix`` (a host's workers: ``HOST:``) that hold active jobs."""
        with self.session() as s:
            query = select(Job.worker_id).where(
                Job.status.in_(ACTIVE), Job.worker_id.startswith(prefix, autoescape=True)
            )
            return set(s.scalars(query.distinct()))

    def reap_worker(self, worker_id: str, why: str, max_attempts: int, silent_s: float) -> list[str]:
        """The active jobs of ``worker_id``, known gone (``why``) and silent for ``silent_s`` (a live worker of
        the same name elsewhere keeps beating), handled as ``reap_expired`` handles them."""
        deadline = now() - silent_s
        with self.session() as s:
            query = select(Job).where(Job.status.in_(ACTIVE), Job.worker_id == worker_id, Job.heartbeat_at < deadline)
            held = list(s.scalars(query))
        return self._reap(held, why, max_attempts)

    def _reap(self, lost_jobs: list[Job], why: str, max_attempts: int) -> list[str]:
        reaped = []
        for job in lost_jobs:
            lost = f"worker {job.worker_id} {why}"
            base = {"worker_id": None, "heartbeat_at": None}
            if job.control == "cancel":
                ok = self._transition(
                    job.id,
                    job.status,
                    f"{lost}; job cancelled",
                    status="cancelled",
                    finished_at=now_s(),
                    control=None,
                    **base,
                )
            elif job.attempts >= max_attempts:
                ok = self._transition(
                    job.id,
                    job.status,
                    f"{lost}; giving up after {job.attempts} attempts",
                    "error",
                    status="failed",
                    finished_at=now_s(),
                    error_code="worker_lost",
                    error_message=f"{lost} {job.attempts} times",
                    **base,
                )
            elif job.control == "pause":
                ok = self._transition(
                    job.id,
                    job.status,
                    f"{lost}; job paused at its last checkpoint",
                    status="paused",
                    control=None,
                    **base,
                )
            else:
                ok = self._transition(
                    job.id,
                    job.status,
                    f"{lost}; requeued to resume from the last checkpoint",
                    "warn",
                    status="queued",
                    **base,
                )
            if ok:
                reaped.append(job.id)
        return reaped

    def requeue(self, job_id: str, worker_id: str, reason: str) -> bool:
        """A worker hands back a job it cannot finish (it is shutting down)."""
        with self.session() as s:
            result = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.worker_id == worker_id, Job.status.in_(ACTIVE))
                .values(status="queued", worker_id=None, heartbeat_at=None, updated_at=now())
            )
            if result.rowcount == 1:
                s.add(_event(job_id, f"{reason}; requeued", "warn"))
            return result.rowcount == 1

    def finish(self, job_id: str, attempt: int, status: str, message: str, level: str = "info", **values: Any) -> bool:
        """The job process's last word; ignored if the job was reaped and claimed again meanwhile."""
        assert status in ("succeeded", "failed", "cancelled", "paused")
        extra = {} if status == "paused" else {"finished_at": now_s()}
        with self.session() as s:
            result = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.attempts == attempt, Job.status.in_(ACTIVE))
                .values(
                    status=status, control=None, worker_id=None, heartbeat_at=None, updated_at=now(), **extra, **values
                )
            )
            if result.rowcount == 1:
                s.add(_event(job_id, message, level))
            return result.rowcount == 1
