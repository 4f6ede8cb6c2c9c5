"""live lease names unique per project in the database itself: a partial unique index over the
leases not deleted, in place of the plain (project, name) index

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27 01:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

LIVE = sa.text("deleted_at IS NULL")


def upgrade() -> None:
    op.drop_index("ix_leases_project", table_name="leases")
    op.create_index(
        "uq_leases_live_name",
        "leases",
        ["project_id", "name"],
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )


def downgrade() -> None:
    op.drop_index("uq_leases_live_name", table_name="leases")
    op.create_index("ix_leases_project", "leases", ["project_id", "name"], unique=False)
