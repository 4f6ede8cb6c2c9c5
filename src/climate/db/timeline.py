"""What the dashboard's timeline and calendar feed read: resources of one kind with the
allocations overlapping a window, and a project's leases. Plain rows, no ORM objects: the
timeline of a thousand hosts is read on every page load."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple, cast

from sqlalchemy import BigInteger, Executable, Select, literal, select, union_all
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from climate.db.tables import (
    Host,
    HostAllocation,
    InstanceAllocation,
    Item,
    ItemAllocation,
    Lease,
    VolumeAllocation,
    VolumePool,
)


class epoch(FunctionElement[int]):
    """Whole seconds since the epoch of a UTC timestamp column, computed by the database: a
    month of a thousand hosts is tens of thousands of timestamps, too many to parse in Python."""

    type = BigInteger()
    inherit_cache = True
    name = "epoch"


@compiles(epoch, "sqlite")
def _epoch_sqlite(element: epoch, compiler: SQLCompiler, **kw: Any) -> str:
    # Stored as naive UTC text (db/types.py).
    return f"CAST(strftime('%s', {compiler.process(element.clauses, **kw)}) AS INTEGER)"


@compiles(epoch, "postgresql")
def _epoch_postgresql(element: epoch, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST(FLOOR(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)})) AS BIGINT)"


class ResourceRow(NamedTuple):
    id: int
    name: str
    reservable: bool
    pool: str
    """An item's pool ("" for hosts, volume pools and items without one)."""


Allocation = tuple[int, int, int, int, str, str, str, str]
"""One allocation as the database returns it, a plain tuple (a month of a thousand hosts is
tens of thousands of them): resource id, start and end (seconds since the epoch), amount
(instances on a host, GB of a volume pool; 0 for a whole resource), then its lease's id, name,
project and status."""


class LeaseRow(NamedTuple):
    id: str
    name: str
    project_id: str
    status: str
    start: dt.datetime
    end: dt.datetime


def hosts(session: Session) -> list[ResourceRow]:
    rows = session.execute(
        select(Host.id, Host.hypervisor_hostname, Host.reservable, Host.health).order_by(
            Host.hypervisor_hostname
        )
    )
    return [ResourceRow(i, name, bool(ok) and health == "up", "") for i, name, ok, health in rows]


def items(session: Session, kind: str) -> list[ResourceRow]:
    rows = session.execute(
        select(Item.id, Item.name, Item.reservable, Item.pool)
        .where(Item.kind == kind)
        .order_by(Item.pool, Item.name)
    )
    return [ResourceRow(i, name, bool(ok), pool) for i, name, ok, pool in rows]


def volume_pools(session: Session) -> list[ResourceRow]:
    rows = session.execute(
        select(VolumePool.id, VolumePool.name, VolumePool.reservable).order_by(VolumePool.name)
    )
    return [ResourceRow(i, name, bool(ok), "") for i, name, ok in rows]


def host_allocations(session: Session, start: dt.datetime, end: dt.datetime) -> list[Allocation]:
    """Whole-host and instance allocations overlapping [start, end)."""
    whole = _overlapping(HostAllocation, HostAllocation.host_id, None, start, end)
    packed = _overlapping(
        InstanceAllocation, InstanceAllocation.host_id, InstanceAllocation.count, start, end
    )
    return _rows(session, union_all(whole, packed))


def item_allocations(
    session: Session, kind: str, start: dt.datetime, end: dt.datetime
) -> list[Allocation]:
    query = _overlapping(ItemAllocation, ItemAllocation.item_id, None, start, end)
    return _rows(
        session, query.join(Item, Item.id == ItemAllocation.item_id).where(Item.kind == kind)
    )


def volume_allocations(session: Session, start: dt.datetime, end: dt.datetime) -> list[Allocation]:
    query = _overlapping(
        VolumeAllocation, VolumeAllocation.pool_id, VolumeAllocation.size_gb, start, end
    )
    return _rows(session, query)


def _overlapping(
    model: Any, resource: Any, amount: Any, start: dt.datetime, end: dt.datetime
) -> Select[Any]:
    return (
        select(
            resource,
            epoch(model.start_date),
            epoch(model.end_date),
            amount if amount is not None else literal(0),
            Lease.id,
            Lease.name,
            Lease.project_id,
            Lease.status,
        )
        .join(Lease, Lease.id == model.lease_id)
        .where(model.end_date > start, model.start_date < end, Lease.deleted_at.is_(None))
    )


def _rows(session: Session, query: Executable) -> list[Allocation]:
    # On the connection, not the session: the ORM's row loading costs more than the query.
    rows = session.connection().execute(query).all()
    return cast(list[Allocation], rows)


def leases(session: Session, project_id: str | None) -> list[LeaseRow]:
    """Live (not deleted) leases of ``project_id`` (None: every project), by start."""
    query = select(
        Lease.id, Lease.name, Lease.project_id, Lease.status, Lease.start_date, Lease.end_date
    ).where(Lease.deleted_at.is_(None))
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    rows = session.execute(query.order_by(Lease.start_date, Lease.id))
    return [LeaseRow(*r) for r in rows]
