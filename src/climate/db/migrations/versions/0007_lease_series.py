"""lease series: recurring leases from an iCalendar RRULE, one lease per occurrence

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_series",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("project_id", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.String(length=255), nullable=False),
        sa.Column("rrule", sa.Text(), nullable=False),
        sa.Column("exdates", sa.JSON(), nullable=False),
        sa.Column("first_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_seconds", sa.Integer(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_lease_series_project", "lease_series", ["project_id", "name"])
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("series_id", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("occurrence", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_leases_series", ["series_id", "occurrence"])


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_index("ix_leases_series")
        batch.drop_column("occurrence")
        batch.drop_column("series_id")
    op.drop_index("ix_lease_series_project", table_name="lease_series")
    op.drop_table("lease_series")
