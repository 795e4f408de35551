"""When each job was last claimed (``jobs.claimed_at``), so that claims go round-robin across tenants.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_at", sa.Float(), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_owner_claimed_at"), ["owner", "claimed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_owner_claimed_at"))
        batch_op.drop_column("claimed_at")
