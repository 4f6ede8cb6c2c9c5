"""instance allocations: instances of a reservation sharing a host's capacity

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_allocations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("reservation_id", sa.String(length=36), nullable=False),
        sa.Column("lease_id", sa.String(length=36), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("disk_gb", sa.Integer(), nullable=False),
        sa.Column("start_date", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_date", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"]),
        sa.ForeignKeyConstraint(["reservation_id"], ["reservations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_instance_allocations_start", "instance_allocations", ["start_date"])
    op.create_index("ix_instance_allocations_end", "instance_allocations", ["end_date"])
    op.create_index(
        "ix_instance_allocations_host", "instance_allocations", ["host_id", "start_date"]
    )
    op.create_index(op.f("ix_instance_allocations_lease_id"), "instance_allocations", ["lease_id"])
    op.create_index(
        op.f("ix_instance_allocations_reservation_id"), "instance_allocations", ["reservation_id"]
    )


def downgrade() -> None:
    op.drop_table("instance_allocations")
