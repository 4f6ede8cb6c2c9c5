"""host power: when the power policy powered each host down and up again

Revision ID: 0017
Revises: 0015
Create Date: 2026-11-25 04:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_power",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "host_id", sa.Integer(), sa.ForeignKey("hosts.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("off_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("on_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_host_power_host", "host_power", ["host_id", "on_at"])
    op.create_index("ix_host_power_off", "host_power", ["off_at"])


def downgrade() -> None:
    op.drop_table("host_power")
