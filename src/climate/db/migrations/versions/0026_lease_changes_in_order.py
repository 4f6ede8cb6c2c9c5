"""lease_revisions.seq: the leases that changed since a listing was read, in commit order.

Each bump of a lease's revision also gives it the next number of one sequence (``seq``, the
largest so far plus one; SQLite's writers are serialised), so that a process keeping a page of
leases reads only the leases that changed since (``db/lease_views.changed_since``) instead of
the whole page. A lease deleted outright keeps its row, bumped: the sequence never goes back.
New leases bump too, so that a lease is seen before any of its rows. PostgreSQL gets the column
and no trigger (migration 0023).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 22:30:00
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_0023 = importlib.import_module("climate.db.migrations.versions.0023_lease_revisions")
NEXT = "(SELECT coalesce(max(seq), 0) + 1 FROM lease_revisions)"
BUMP = (
    "INSERT INTO lease_revisions (lease_id, revision, seq) VALUES ({lease}, 1, " + NEXT + ") "
    "ON CONFLICT (lease_id) DO UPDATE SET revision = revision + 1, seq = excluded.seq;"
)
MOVED = (
    " INSERT INTO lease_revisions (lease_id, revision, seq) SELECT OLD.lease_id, 1, "
    + NEXT
    + " WHERE OLD.lease_id != NEW.lease_id "
    "ON CONFLICT (lease_id) DO UPDATE SET revision = revision + 1, seq = excluded.seq;"
)
INDEX = "ix_lease_revisions_seq"


def triggers() -> dict[str, str]:
    """Each trigger's name and its statement."""
    new_lease = (
        "CREATE TRIGGER lease_revision_leases_new AFTER INSERT ON leases BEGIN "
        + BUMP.format(lease="NEW.id")
        + " END"
    )
    made = _0023.triggers(BUMP, MOVED, BUMP.format(lease="OLD.id"))
    return {"lease_revision_leases_new": new_lease, **made}


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:  # before the table changes: they name it
        for name in _0023.triggers():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    with op.batch_alter_table("lease_revisions") as batch:
        batch.add_column(sa.Column("seq", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index(INDEX, ["seq"])
    if sqlite:
        for statement in triggers().values():
            op.execute(statement)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for name in triggers():
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    with op.batch_alter_table("lease_revisions") as batch:
        batch.drop_index(INDEX)
        batch.drop_column("seq")
    if sqlite:
        for statement in _0023.triggers().values():
            op.execute(statement)
