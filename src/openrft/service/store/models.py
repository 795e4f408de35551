"""The job store's tables. The schema is created and upgraded by the Alembic migrations beside this file."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
Seq = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class StoredFile(Base):
    __tablename__ = "files"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    owner: Mapped[str] = mapped_column(String(40))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(40))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    storage_name: Mapped[str] = mapped_column(String(80))

    __table_args__ = (Index(None, "owner", "seq"),)


class Job(Base):
    __tablename__ = "jobs"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    owner: Mapped[str] = mapped_column(String(40))
    api: Mapped[str] = mapped_column(String(16))  # the dialect it was submitted in: openai | vertex | nova
    status: Mapped[str] = mapped_column(String(24))
    control: Mapped[str | None] = mapped_column(String(16), nullable=True)  # pause | cancel, asked of a running job
    request: Mapped[Any] = mapped_column(JSON)  # the body as submitted
    spec: Mapped[Any] = mapped_column(JSON)  # the resolved JobSpec
    model: Mapped[str] = mapped_column(String(500))
    display_name: Mapped[str | None] = mapped_column(String(500), nullable=True)
    training_file: Mapped[str | None] = mapped_column(String(500), nullable=True)
    validation_file: Mapped[str | None] = mapped_column(String(500), nullable=True)
    seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    user_metadata: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    worker_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # its last claim: tenants take turns
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(500), nullable=True)
    result_files: Mapped[Any] = mapped_column(JSON, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_param: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # what a queued job waits for on the server's Ray cluster ("2 CPU, 1 free"; migration 0005); None: its turn
    queue_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # its place among its tenant's queued jobs, higher first (openrft.priority; migration 0006); never across tenants
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (Index(None, "owner", "seq"), Index(None, "status", "seq"), Index(None, "owner", "claimed_at"))


class TenantQuota(Base):
    """The CPU- and GPU-seconds a tenant's jobs may reserve, counted from ``since`` (None: no limit). The owner
    ``*`` holds the default of tenants without a row of their own. Set by the operator (``openrft keys quota``)."""

    __tablename__ = "tenant_quotas"

    owner: Mapped[str] = mapped_column(String(40), primary_key=True)
    cpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    since: Mapped[float] = mapped_column(Float)  # use before it is not counted (a reset)
    updated_at: Mapped[float] = mapped_column(Float)


class JobUsage(Base):
    """What one attempt of a job reserved (CPUs, GPUs) and from when to when its worker last saw it running:
    its CPU-seconds are ``cpu * (last_seen - started_at)``. The worker writes ``last_seen`` at each heartbeat and
    when the attempt ends, so a worker that dies leaves at most one heartbeat uncounted."""

    __tablename__ = "job_usage"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(40))
    cpu: Mapped[float] = mapped_column(Float)
    gpu: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index(None, "owner", "last_seen"),)


class Event(Base):
    __tablename__ = "events"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[int] = mapped_column(BigInteger)
    level: Mapped[str] = mapped_column(String(8))
    type: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[Any] = mapped_column(JSON, nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)  # set on metrics events

    __table_args__ = (Index(None, "job_id", "seq"),)


class StepMetrics(Base):
    """One row per (job, step): a resumed run overwrites the steps past its checkpoint, never adds twice."""

    __tablename__ = "metrics"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[Any] = mapped_column(JSON)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(60), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(40))
    step: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(Text)
    val_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[Any] = mapped_column(JSON, nullable=True)

    # not unique: a Tinker client saves its state and its sampler weights at one step (migration 0004)
    __table_args__ = (Index(None, "job_id", "step"),)


class Sample(Base):
    """One recorded sample of a job (``engine/samples.py``): the record in ``data``, and the fields the samples
    route filters and sorts by as columns. ``graders`` is ``|name|name|``, for a LIKE match on one name."""

    __tablename__ = "samples"

    seq: Mapped[int] = mapped_column(Seq, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(8))  # train | eval
    step: Mapped[int] = mapped_column(Integer)
    example_id: Mapped[str] = mapped_column(String(200))
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    advantage: Mapped[float | None] = mapped_column(Float, nullable=True)
    error_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    graders: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(Integer)
    data: Mapped[Any] = mapped_column(JSON)

    __table_args__ = (Index(None, "job_id", "kind", "step"), Index(None, "job_id", "example_id"))
