"""host health: a host down, forced down or disabled is unreservable and its reservations are
healed; a reservation remembers the hosts it lost with no replacement

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-08 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("health", sa.String(16), nullable=False, server_default="up"))
        batch.add_column(sa.Column("health_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("health_since", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_down_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("missing_hosts", sa.JSON(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+): rebuilding the tables, as batch mode would on SQLite,
    # fails the foreign keys that refer to them.
    with op.batch_alter_table("reservations", recreate="never") as batch:
        batch.drop_column("missing_hosts")
    with op.batch_alter_table("hosts", recreate="never") as batch:
        for column in ("last_down_at", "health_since", "health_reason", "health"):
            batch.drop_column(column)
