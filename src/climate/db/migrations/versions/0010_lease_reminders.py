"""leases store their reminders' offsets, so that waiting leases and holds can have them

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 12:00:00
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# db/leases.REMINDER_PRIORITY as of this revision: it marks a before-end event as a reminder.
REMINDER_PRIORITY = 3


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("reminders", sa.JSON(), nullable=True))
    # Until now a reminder's offset was its lease's end minus its event's time.
    leases = sa.table(
        "leases",
        sa.column("id", sa.String()),
        sa.column("end_date", sa.DateTime(timezone=True)),
        sa.column("reminders", sa.JSON()),
    )
    events = sa.table(
        "events",
        sa.column("lease_id", sa.String()),
        sa.column("event_type", sa.String()),
        sa.column("time", sa.DateTime(timezone=True)),
        sa.column("priority", sa.Integer()),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(leases.c.id, leases.c.end_date, events.c.time)
        .join(events, events.c.lease_id == leases.c.id)
        .where(events.c.event_type == "before_end_lease", events.c.priority == REMINDER_PRIORITY)
    )
    offsets: dict[str, set[int]] = defaultdict(set)
    for lease_id, end, when in rows:
        offsets[lease_id].add(int((end - when).total_seconds()))
    for lease_id, found in offsets.items():
        bind.execute(
            sa.update(leases)
            .where(leases.c.id == lease_id)
            .values(reminders=sorted(found, reverse=True))
        )


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+): rebuilding the table, as batch mode would on SQLite,
    # fails its foreign keys once reservations and events refer to it.
    with op.batch_alter_table("leases", recreate="never") as batch:
        batch.drop_column("reminders")
