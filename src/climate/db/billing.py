"""What usage reports read: every allocation overlapping a period, with its lease's project and
real start and end (when its start and end events were done), and the properties of the
resources allocated. One query per allocation table, on the allocations' start and end indexes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, Select, String, and_, select, type_coerce
from sqlalchemy.orm import Session, aliased

from climate.db.tables import (
    Event,
    HostAllocation,
    HostProperty,
    InstanceAllocation,
    Item,
    ItemAllocation,
    ItemProperty,
    Lease,
    VolumeAllocation,
    VolumePoolProperty,
)
from climate.db.types import utc_text
from climate.domain.status import EventStatus, EventType


@dataclass(frozen=True)
class Held:
    """One allocation: ``amounts`` units (by unit name) of resource ``resource`` over
    [start, end), for a lease of ``project_id`` really started at ``started`` (None: never)
    and really ended at ``ended`` (None: not yet)."""

    project_id: str
    table: str
    """``host``, ``instance``, ``volume`` or an item kind (``floatingip``, ``device``, ...)."""
    resource: int
    amounts: tuple[int, ...]
    start: dt.datetime
    end: dt.datetime
    started: dt.datetime | None
    ended: dt.datetime | None


def held(
    session: Session, begin: dt.datetime, finish: dt.datetime, project_id: str | None
) -> Iterator[Held]:
    """Every allocation overlapping [begin, finish), of ``project_id``'s leases or all."""
    sources: list[tuple[str, Any, list[Any]]] = [
        ("host", HostAllocation, [HostAllocation.host_id]),
        (
            "instance",
            InstanceAllocation,
            [InstanceAllocation.host_id, InstanceAllocation.vcpus, InstanceAllocation.memory_mb],
        ),
        ("volume", VolumeAllocation, [VolumeAllocation.pool_id, VolumeAllocation.size_gb]),
    ]
    stamp = _stamp_reader(session)
    for table, model, columns in sources:
        for row in session.execute(_query(session, model, columns, begin, finish, project_id)):
            yield Held(
                row[0],
                table,
                int(row[5]),
                tuple(int(v) for v in row[6:]) or (1,),
                stamp(row[1]),
                stamp(row[2]),
                None if row[3] is None else stamp(row[3]),
                None if row[4] is None else stamp(row[4]),
            )
    query = _query(
        session, ItemAllocation, [ItemAllocation.item_id, Item.kind], begin, finish, project_id
    )
    query = query.join(Item, Item.id == ItemAllocation.item_id)
    for row in session.execute(query):
        yield Held(
            row[0],
            str(row[6]),
            int(row[5]),
            (1,),
            stamp(row[1]),
            stamp(row[2]),
            None if row[3] is None else stamp(row[3]),
            None if row[4] is None else stamp(row[4]),
        )


def _stamp_reader(session: Session) -> Callable[[Any], dt.datetime]:
    """Timestamps are read raw (``_raw``) and made aware UTC here: SQLite's text through
    ``fromisoformat`` is several times faster than the column type's own parsing, which counts
    at tens of thousands of rows."""
    if session.get_bind().dialect.name == "sqlite":
        return utc_text
    return lambda value: value.astimezone(dt.UTC)


def _raw(session: Session, column: Any, name: str) -> Any:
    kind = String() if session.get_bind().dialect.name == "sqlite" else DateTime(timezone=True)
    return type_coerce(column, kind).label(name)


def _query(
    session: Session,
    model: Any,
    columns: list[Any],
    begin: dt.datetime,
    finish: dt.datetime,
    project_id: str | None,
) -> Select[Any]:
    start = aliased(Event)
    end = aliased(Event)
    query = (
        select(
            Lease.project_id,
            _raw(session, model.start_date, "start"),
            _raw(session, model.end_date, "end"),
            _raw(session, start.done_at, "started"),
            _raw(session, end.done_at, "ended"),
            *columns,
        )
        .join(Lease, Lease.id == model.lease_id)
        .outerjoin(
            start,
            and_(
                start.lease_id == model.lease_id,
                start.event_type == EventType.START_LEASE,
                start.status == EventStatus.DONE,
            ),
        )
        .outerjoin(
            end,
            and_(
                end.lease_id == model.lease_id,
                end.event_type == EventType.END_LEASE,
                end.status == EventStatus.DONE,
            ),
        )
        .where(model.start_date < finish, model.end_date > begin)
    )
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    return query


def properties(session: Session, table: str, ids: Collection[int]) -> dict[int, dict[str, str]]:
    """The properties of these hosts (``host``, ``instance``), volume pools (``volume``) or
    items (an item kind), by id."""
    if not ids:
        return {}
    model: type[HostProperty] | type[VolumePoolProperty] | type[ItemProperty]
    if table in ("host", "instance"):
        model, owner = HostProperty, HostProperty.host_id
    elif table == "volume":
        model, owner = VolumePoolProperty, VolumePoolProperty.pool_id
    else:
        model, owner = ItemProperty, ItemProperty.item_id
    found: dict[int, dict[str, str]] = {}
    query = select(owner, model.name, model.value).where(owner.in_(list(ids)))
    for resource, name, value in session.execute(query):
        found.setdefault(int(resource), {})[str(name)] = str(value)
    return found
