"""Per-tenant quotas of CPU- and GPU-seconds (``tenant_quotas``, set by the operator), what each job attempt
reserved and for how long (``job_usage``, what a quota counts), and a job's priority among its tenant's queued
jobs (``jobs.priority``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 21:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "tenant_quotas",
        sa.Column("owner", sa.String(length=40), nullable=False),
        sa.Column("cpu_seconds", sa.Float(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_tenant_quotas")),
    )
    op.create_table(
        "job_usage",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=40), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("gpu", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_job_usage")),
    )
    with op.batch_alter_table("job_usage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_usage_owner_last_seen"), ["owner", "last_seen"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_usage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_usage_owner_last_seen"))
    op.drop_table("job_usage")
    op.drop_table("tenant_quotas")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("priority")
