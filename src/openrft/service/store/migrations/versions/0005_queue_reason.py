"""What a queued job waits for (``jobs.queue_reason``): on the server's Ray cluster a job starts only once its
placement group is reserved, and until then its reason ("2 CPU, 1 free") is shown on the job.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("queue_reason")
