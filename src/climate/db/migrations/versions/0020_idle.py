"""lease idle: when each lease was last seen in use and last warned of idleness, and whether
an admin exempted it

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_idle",
        sa.Column(
            "lease_id",
            sa.String(36),
            sa.ForeignKey("leases.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("warned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exempt", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_table("lease_idle")
