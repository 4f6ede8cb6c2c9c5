"""The series index holds only the leases of a series.

``ix_leases_series`` had a row for every lease, most of them with no series: each admission
wrote a page of it (4 KB of SQLite's WAL) for nothing. Partial on ``series_id IS NOT NULL``, it
still serves every read of it (``series_id = :id`` implies the condition).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

INDEX = "ix_leases_series"
COLUMNS = ["series_id", "occurrence"]
IN_A_SERIES = sa.text("series_id IS NOT NULL")


def upgrade() -> None:
    op.drop_index(INDEX, table_name="leases")
    op.create_index(
        INDEX, "leases", COLUMNS, sqlite_where=IN_A_SERIES, postgresql_where=IN_A_SERIES
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="leases")
    op.create_index(INDEX, "leases", COLUMNS)
