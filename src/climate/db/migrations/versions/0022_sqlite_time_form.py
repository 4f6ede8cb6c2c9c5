"""SQLite: every stored time in one text form, with its microseconds.

The form: "2030-01-01 12:00:00.000000". Rows written below the ORM (``db/raw.py``) were stored
without them when they were zero ("2030-01-01 12:00:00"), and text order is time order only
within one form: a time compared with itself in the other form came out earlier or later (an
allocation cut at its start was kept, holding nothing). PostgreSQL stores times as times:
nothing to do.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 08:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

TIMES = {
    "api_tokens": ("created_at", "expires_at", "revoked_at"),
    "assignments": ("assigned_at", "released_at"),
    "audit_log": ("at",),
    "credit_ledger": ("at",),
    "events": ("time", "not_before", "claimed_until", "done_at", "created_at", "updated_at"),
    "host_allocations": ("start_date", "end_date"),
    "host_power": ("off_at", "on_at"),
    "hosts": ("health_since", "last_down_at", "created_at", "updated_at"),
    "instance_allocations": ("start_date", "end_date"),
    "item_allocations": ("start_date", "end_date"),
    "items": ("created_at", "updated_at"),
    "lease_idle": ("last_used_at", "warned_at"),
    "lease_series": ("first_start", "deleted_at", "created_at", "updated_at"),
    "leases": (
        "start_date",
        "end_date",
        "before_end_date",
        "deleted_at",
        "next_attempt_at",
        "deadline",
        "hold_expires_at",
        "requested_earliest_start",
        "requested_latest_end",
        "occurrence",
        "created_at",
        "updated_at",
    ),
    "managers": ("started_at", "heartbeat_at"),
    "outbox": ("next_attempt_at", "created_at", "delivered_at"),
    "refused_demand": ("at", "start_date", "end_date"),
    "reservations": ("created_at", "updated_at"),
    "resource_properties": ("created_at", "updated_at"),
    "volume_allocations": ("start_date", "end_date"),
    "volume_pools": ("created_at", "updated_at"),
}
SHORT = len("2030-01-01 12:00:00")


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in TIMES.items():
        for column in columns:
            op.execute(
                sa.text(
                    f"UPDATE {table} SET {column} = {column} || '.000000' "
                    f"WHERE length({column}) = {SHORT}"
                )
            )


def downgrade() -> None:
    pass  # the longer form reads back as the same times
