"""Any number of checkpoints per (job, step): a Tinker training client saves its state and its sampler
weights at the same step (``save_state("final")`` and ``save_weights_for_sampler("final")``), each a row.
The unique (job_id, step) constraint becomes a plain index; a job's own checkpoints stay one per step by
their id (``ftckpt-JOB-STEP``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 19:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_constraint("uq_checkpoints_job_id_step", type_="unique")
        batch_op.create_index(batch_op.f("ix_checkpoints_job_id_step"), ["job_id", "step"], unique=False)


def downgrade() -> None:
    # two checkpoints of one step would break the constraint: keep the newest row of each (job, step)
    op.execute(
        "DELETE FROM checkpoints WHERE EXISTS (SELECT 1 FROM checkpoints AS later WHERE later.job_id = "
        "checkpoints.job_id AND later.step = checkpoints.step AND (later.created_at > checkpoints.created_at OR "
        "(later.created_at = checkpoints.created_at AND later.id > checkpoints.id)))"
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_job_id_step"))
        batch_op.create_unique_constraint(batch_op.f("uq_checkpoints_job_id_step"), ["job_id", "step"])
