"""Volume pools and volume allocations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import NamedTuple

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from climate.db import allocations as allocation_rows
from climate.db.allocations import narrowed
from climate.db.items import set_properties
from climate.db.leases import after_marker, keyset_order
from climate.db.tables import (
    Lease,
    VolumeAllocation,
    VolumePool,
    VolumePoolProperty,
    new_id,
    table_of,
)
from climate.db.types import iso_text

RESOURCE_TYPE = "virtual:volume"
SORT_KEYS = ("id", "name", "created_at")


def get(session: Session, pool_id: int) -> VolumePool | None:
    return session.get(VolumePool, pool_id)


def get_by_name(session: Session, name: str) -> VolumePool | None:
    return session.scalars(select(VolumePool).where(VolumePool.name == name)).first()


def list_page(
    session: Session,
    *,
    limit: int | None = None,
    marker: VolumePool | None = None,
    sort_key: str = "id",
    descending: bool = False,
) -> Sequence[VolumePool]:
    column = getattr(VolumePool, sort_key)
    query = select(VolumePool).order_by(*keyset_order(column, VolumePool.id, descending))
    if marker is not None:
        query = query.where(
            after_marker(column, VolumePool.id, getattr(marker, sort_key), marker.id, descending)
        )
    return session.scalars(query.limit(limit)).all()


def _property(name: str, value: str) -> VolumePoolProperty:
    return VolumePoolProperty(name=name, value=value)


def save(session: Session, pool: VolumePool, properties: dict[str, str | None]) -> None:
    set_properties(pool.properties, _property, properties)
    session.add(pool)
    session.flush()


def remove(session: Session, pool: VolumePool) -> None:
    """Delete ``pool`` with its (past) allocations."""
    session.execute(delete(VolumeAllocation).where(VolumeAllocation.pool_id == pool.id))
    session.delete(pool)
    session.flush()


def leases_holding(session: Session, pool_id: int, since: dt.datetime) -> list[str]:
    return allocation_rows.leases_holding(session, VolumeAllocation.pool_id, pool_id, since)


def reservable(session: Session) -> Sequence[VolumePool]:
    query = select(VolumePool).where(VolumePool.reservable.is_(True)).order_by(VolumePool.id)
    return session.scalars(query).all()


def uses(
    session: Session,
    pool_ids: Collection[int],
    start: dt.datetime,
    end: dt.datetime,
    other_than: str,
) -> dict[int, list[tuple[dt.datetime, dt.datetime, int]]]:
    """What reservations other than ``other_than`` hold in each pool over [start, end)."""
    found: dict[int, list[tuple[dt.datetime, dt.datetime, int]]] = {p: [] for p in pool_ids}
    rows = session.execute(
        select(
            VolumeAllocation.pool_id,
            VolumeAllocation.start_date,
            VolumeAllocation.end_date,
            VolumeAllocation.size_gb,
        ).where(
            VolumeAllocation.pool_id.in_(list(pool_ids)),
            VolumeAllocation.start_date < end,
            VolumeAllocation.end_date > start,
            VolumeAllocation.reservation_id != other_than,
        )
    )
    for pool_id, s, e, size in rows:
        found[pool_id].append((s, e, size))
    return found


def replace(
    session: Session,
    reservation_id: str,
    lease_id: str,
    pool_id: int,
    size_gb: int,
    start: dt.datetime,
    end: dt.datetime,
) -> VolumeAllocation:
    """Give the reservation ``size_gb`` of ``pool_id`` over [start, end), and nothing else."""
    session.execute(
        delete(VolumeAllocation).where(VolumeAllocation.reservation_id == reservation_id)
    )
    row = VolumeAllocation(
        id=new_id(),
        reservation_id=reservation_id,
        lease_id=lease_id,
        pool_id=pool_id,
        size_gb=size_gb,
        start_date=start,
        end_date=end,
    )
    session.execute(
        insert(table_of(VolumeAllocation)),
        [{c.key: getattr(row, c.key) for c in table_of(VolumeAllocation).columns}],
    )
    return row


def truncate(session: Session, reservation_id: str, at: dt.datetime) -> None:
    """End the reservation's allocations at ``at`` (drop those that had not begun)."""
    allocation_rows.truncate(session, VolumeAllocation, reservation_id, at)


class PoolAllocation(NamedTuple):
    """A volume reservation's allocation in a pool, as its listing shows it."""

    pool_id: int
    reservation_id: str
    lease_id: str
    size_gb: int
    start_date: str
    """Naive UTC ISO text, Blazar's lease date (``types.iso_text``)."""
    end_date: str


def allocations(
    session: Session,
    *,
    pool_ids: Collection[int],
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> list[PoolAllocation]:
    """Allocations of live leases in ``pool_ids`` overlapping [start, end), filtered as asked."""
    query = (
        select(
            VolumeAllocation.pool_id,
            VolumeAllocation.reservation_id,
            VolumeAllocation.lease_id,
            VolumeAllocation.size_gb,
            iso_text(VolumeAllocation.start_date),
            iso_text(VolumeAllocation.end_date),
        )
        .join(Lease, Lease.id == VolumeAllocation.lease_id)
        .where(Lease.deleted_at.is_(None), VolumeAllocation.pool_id.in_(list(pool_ids)))
        .order_by(VolumeAllocation.pool_id, VolumeAllocation.start_date)
    )
    query = narrowed(
        query,
        VolumeAllocation,
        lease_id=lease_id,
        reservation_id=reservation_id,
        project_id=project_id,
        start=start,
        end=end,
    )
    return list(map(PoolAllocation._make, session.connection().execute(query).all()))
