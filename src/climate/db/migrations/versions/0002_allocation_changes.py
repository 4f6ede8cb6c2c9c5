"""allocation change log for in-memory calendars

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 00:40:00
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
        "allocation_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("reservation_id", sa.String(length=36), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_allocation_changes_version"), "allocation_changes", ["version"], unique=False
    )
    op.bulk_insert(
        sa.table("locks", sa.column("name", sa.String), sa.column("version", sa.Integer)),
        [{"name": "calendar_pruned", "version": 0}],
    )


def downgrade() -> None:
    op.execute("DELETE FROM locks WHERE name = 'calendar_pruned'")
    op.drop_index(op.f("ix_allocation_changes_version"), table_name="allocation_changes")
    op.drop_table("allocation_changes")
