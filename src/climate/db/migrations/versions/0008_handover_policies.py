"""handover policies: the standalone backend records each assignment's start and end policy
and what it did with the workload

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(
            sa.Column("start_policy", sa.String(length=16), nullable=False, server_default="auto")
        )
        batch.add_column(
            sa.Column("end_policy", sa.String(length=16), nullable=False, server_default="release")
        )
        batch.add_column(
            sa.Column("state", sa.String(length=16), nullable=False, server_default="running")
        )
    # Assignments ended before this revision were released.
    op.execute("UPDATE assignments SET state = 'released' WHERE released_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("state")
        batch.drop_column("end_policy")
        batch.drop_column("start_policy")
