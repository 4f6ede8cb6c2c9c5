"""SQLite: a ledger entry moves its project's balance by trigger.

So posting an entry is one statement (``db/credits.post``: the insert reads the balance, only
where it stays at or above zero; SQLite serialises writers). PostgreSQL posts with a
data-modifying WITH and needs no trigger.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 15:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

TRIGGER = "credit_ledger_moves_balance"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON credit_ledger BEGIN "
            "UPDATE credit_balances SET balance_cents = balance_cents + NEW.amount_cents "
            "WHERE project_id = NEW.project_id; END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")
