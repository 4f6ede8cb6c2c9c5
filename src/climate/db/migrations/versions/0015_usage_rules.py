"""usage rules: a project's leases by their end, so what it holds over a time range is one
indexed range scan (db/usage.py)

Revision ID: 0015
Revises: 0012
Create Date: 2026-11-25 04:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_leases_project_end", "leases", ["project_id", "end_date"])


def downgrade() -> None:
    op.drop_index("ix_leases_project_end", table_name="leases")
