"""lease types: immediate, retry, best effort, scheduled; priority, attempts, deadline, holds

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = (
    "lease_type",
    "priority",
    "attempts",
    "max_attempts",
    "next_attempt_at",
    "deadline",
    "hold_expires_at",
)


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(
            sa.Column(
                "lease_type", sa.String(length=16), nullable=False, server_default="scheduled"
            )
        )
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("max_attempts", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("hold_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)
