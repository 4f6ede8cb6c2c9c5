"""refused demand: every request Climate did not serve, for GET /v1/demand

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refused_demand",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("project_id", sa.String(255), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column("lease_id", sa.String(36), nullable=True),
        sa.Column("lease_name", sa.String(80), nullable=False),
        sa.Column("step", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("resource_type", sa.String(64), nullable=False),
        sa.Column("count_min", sa.Integer(), nullable=False),
        sa.Column("count_max", sa.Integer(), nullable=False),
        sa.Column("properties", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("start_date", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_date", sa.DateTime(timezone=True), nullable=False),
        sa.Column("offer", sa.JSON(), nullable=True),
    )
    op.create_index("ix_refused_demand_window", "refused_demand", ["start_date", "end_date"])
    op.create_index("ix_refused_demand_project", "refused_demand", ["project_id", "start_date"])


def downgrade() -> None:
    op.drop_table("refused_demand")
