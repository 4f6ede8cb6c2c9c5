"""The live leases in creation order: the default lease listing reads them in order.

``GET /v1/leases`` (sorted by ``created_at``, then ``id``) read every lease ever made and
sorted the live ones; the partial index holds the live ones in that order, with their status
(the listing's first read, ``db/lease_views.revisions``, takes nothing else from the row).

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

INDEX = "ix_leases_live_created"
LIVE = sa.text("deleted_at IS NULL")


def upgrade() -> None:
    op.create_index(
        INDEX,
        "leases",
        ["created_at", "id", "status"],
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="leases")
