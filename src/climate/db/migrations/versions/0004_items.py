"""items (devices, network segments, floating IPs) and volume pools, with their allocations

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _timestamps() -> list[sa.Column[object]]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
    ]


def _properties(table: str, key: str, parent: str) -> None:
    op.create_table(
        table,
        sa.Column(key, sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint([key], [f"{parent}.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(key, "name"),
    )


def upgrade() -> None:
    op.create_table(
        "items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("reservable", sa.Boolean(), nullable=False),
        *_timestamps(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kind", "pool", "name"),
    )
    _properties("item_properties", "item_id", "items")
    op.create_table(
        "item_allocations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("reservation_id", sa.String(length=36), nullable=False),
        sa.Column("lease_id", sa.String(length=36), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("start_date", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_date", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["item_id"], ["items.id"]),
        sa.ForeignKeyConstraint(["reservation_id"], ["reservations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_item_allocations_start", "item_allocations", ["start_date"])
    op.create_index("ix_item_allocations_end", "item_allocations", ["end_date"])
    op.create_index("ix_item_allocations_item", "item_allocations", ["item_id", "start_date"])
    op.create_index(op.f("ix_item_allocations_lease_id"), "item_allocations", ["lease_id"])
    op.create_index(
        op.f("ix_item_allocations_reservation_id"), "item_allocations", ["reservation_id"]
    )
    op.create_table(
        "volume_pools",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("capacity_gb", sa.Integer(), nullable=False),
        sa.Column("reservable", sa.Boolean(), nullable=False),
        *_timestamps(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    _properties("volume_pool_properties", "pool_id", "volume_pools")
    op.create_table(
        "volume_allocations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("reservation_id", sa.String(length=36), nullable=False),
        sa.Column("lease_id", sa.String(length=36), nullable=False),
        sa.Column("pool_id", sa.Integer(), nullable=False),
        sa.Column("size_gb", sa.Integer(), nullable=False),
        sa.Column("start_date", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_date", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["pool_id"], ["volume_pools.id"]),
        sa.ForeignKeyConstraint(["reservation_id"], ["reservations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_volume_allocations_pool", "volume_allocations", ["pool_id", "start_date"])
    op.create_index(op.f("ix_volume_allocations_lease_id"), "volume_allocations", ["lease_id"])
    op.create_index(
        op.f("ix_volume_allocations_reservation_id"), "volume_allocations", ["reservation_id"]
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE item_allocations ADD CONSTRAINT item_allocations_no_overlap "
            "EXCLUDE USING gist (item_id WITH =, tstzrange(start_date, end_date) WITH &&)"
        )


def downgrade() -> None:
    op.drop_table("volume_allocations")
    op.drop_table("volume_pool_properties")
    op.drop_table("volume_pools")
    op.drop_table("item_allocations")
    op.drop_table("item_properties")
    op.drop_table("items")
