"""lease_revisions: a revision per lease, moved by every write to its rows.

How often each lease's rows changed (its own, its reservations', events' and
allocations'), counted by triggers on SQLite, where writers are serialised; a listing renders
again only the leases whose revision moved (``db/lease_views.py``). PostgreSQL gets the table
and no trigger: row locks taken by a trigger would close lock cycles between writers that
change different rows of one lease; there every listing renders every lease.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

CHILDREN = (
    "reservations",
    "events",
    "host_allocations",
    "instance_allocations",
    "item_allocations",
    "volume_allocations",
)
BUMP = (
    "INSERT INTO lease_revisions (lease_id, revision) VALUES ({lease}, 1) "
    "ON CONFLICT (lease_id) DO UPDATE SET revision = revision + 1;"
)
MOVED = (
    " INSERT INTO lease_revisions (lease_id, revision) SELECT OLD.lease_id, 1 "
    "WHERE OLD.lease_id != NEW.lease_id "
    "ON CONFLICT (lease_id) DO UPDATE SET revision = revision + 1;"
)
"""A row moved to another lease (never done today): the one it left changed too."""


GONE = "DELETE FROM lease_revisions WHERE lease_id = OLD.id;"


def triggers(bump: str = BUMP, moved: str = MOVED, gone: str = GONE) -> dict[str, str]:
    """Each trigger's name and its statement: ``bump`` counts a change of lease ``{lease}``,
    ``moved`` one of a row that moved to another lease, ``gone`` a lease deleted outright
    (later migrations count otherwise)."""
    made = {
        "lease_revision_leases": (
            "CREATE TRIGGER lease_revision_leases AFTER UPDATE ON leases BEGIN "
            + bump.format(lease="NEW.id")
            + " END"
        ),
        "lease_revision_leases_gone": (
            f"CREATE TRIGGER lease_revision_leases_gone AFTER DELETE ON leases BEGIN {gone} END"
        ),
    }
    for table in CHILDREN:
        for when, bumps in (
            ("INSERT", bump.format(lease="NEW.lease_id")),
            ("DELETE", bump.format(lease="OLD.lease_id")),
            ("UPDATE", bump.format(lease="NEW.lease_id") + moved),
        ):
            name = f"lease_revision_{table}_{when.lower()}"
            made[name] = f"CREATE TRIGGER {name} AFTER {when} ON {table} BEGIN {bumps} END"
    return made


def upgrade() -> None:
    op.create_table(
        "lease_revisions",
        sa.Column("lease_id", sa.String(36), primary_key=True),
        sa.Column("revision", sa.Integer(), nullable=False),
    )
    if op.get_bind().dialect.name == "sqlite":
        for statement in triggers().values():
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in triggers():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("lease_revisions")
