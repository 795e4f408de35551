"""Recorded samples of jobs: prompts, answers, rewards, grader verdicts (``samples``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "samples",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.String(length=200), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("advantage", sa.Float(), nullable=True),
        sa.Column("error_kind", sa.String(length=32), nullable=True),
        sa.Column("graders", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_samples")),
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_samples_job_id_kind_step"), ["job_id", "kind", "step"], unique=False)
        batch_op.create_index(batch_op.f("ix_samples_job_id_example_id"), ["job_id", "example_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_samples_job_id_example_id"))
        batch_op.drop_index(batch_op.f("ix_samples_job_id_kind_step"))
    op.drop_table("samples")
