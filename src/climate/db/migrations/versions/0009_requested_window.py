"""leases remember a flexible window's request: earliest start, latest end, duration

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(
            sa.Column("requested_earliest_start", sa.DateTime(timezone=True), nullable=True)
        )
        batch.add_column(
            sa.Column("requested_latest_end", sa.DateTime(timezone=True), nullable=True)
        )
        batch.add_column(sa.Column("requested_duration_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("requested_duration_seconds")
        batch.drop_column("requested_latest_end")
        batch.drop_column("requested_earliest_start")
