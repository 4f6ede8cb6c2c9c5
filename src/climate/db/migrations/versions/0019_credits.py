"""credits: a balance per project and an append-only ledger, in whole cents

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "credit_balances",
        sa.Column("project_id", sa.String(255), primary_key=True),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "credit_ledger",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.String(255), nullable=False),
        sa.Column("lease_id", sa.String(36), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("encumbered_cents", sa.BigInteger(), nullable=False),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
    )
    op.create_index("ix_credit_ledger_project", "credit_ledger", ["project_id", "id"])
    op.create_index("ix_credit_ledger_lease", "credit_ledger", ["lease_id"])


def downgrade() -> None:
    op.drop_table("credit_ledger")
    op.drop_table("credit_balances")
