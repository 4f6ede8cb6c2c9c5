"""A page of live leases, read for showing only: plain records in a few statements, with no ORM
objects. Listing a thousand leases through the ORM (a lease, its reservations, events and
allocations: about six objects each, every one with its identity-map state) cost several times
reading the same rows as tuples. The records have the shapes of ``climate.domain.views``, as
the ORM rows do, and come in the order the ORM relationships give."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from climate.db.leases import after_marker, keyset_order
from climate.db.tables import (
    Event,
    HostAllocation,
    InstanceAllocation,
    ItemAllocation,
    Lease,
    Reservation,
    VolumeAllocation,
    table_of,
)

CHUNK = 500
"""Ids per ``IN`` list, as the ORM's selectin loading sends them."""


@dataclass(frozen=True, slots=True)
class HostAllocationRecord:
    reservation_id: str
    host_id: int
    start_date: dt.datetime
    end_date: dt.datetime


@dataclass(frozen=True, slots=True)
class ItemAllocationRecord:
    reservation_id: str
    item_id: int
    start_date: dt.datetime
    end_date: dt.datetime


@dataclass(frozen=True, slots=True)
class VolumeAllocationRecord:
    reservation_id: str
    pool_id: int
    start_date: dt.datetime
    end_date: dt.datetime


@dataclass(frozen=True, slots=True)
class InstanceAllocationRecord:
    reservation_id: str
    host_id: int
    count: int
    start_date: dt.datetime
    end_date: dt.datetime


class EventRecord(NamedTuple):
    id: str
    lease_id: str
    status: str
    event_type: str
    time: dt.datetime
    attempts: int
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime | None


class ReservationRecord(NamedTuple):
    id: str
    lease_id: str
    status: str
    missing_resources: bool
    resources_changed: bool
    missing_hosts: list[str] | None
    resource_id: str
    resource_type: str
    params: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime | None
    allocations: list[HostAllocationRecord]
    item_allocations: list[ItemAllocationRecord]
    volume_allocations: list[VolumeAllocationRecord]
    instance_allocations: list[InstanceAllocationRecord]


class LeaseRecord(NamedTuple):
    id: str
    name: str
    start_date: dt.datetime
    end_date: dt.datetime
    status: str
    status_reason: str | None
    degraded: bool
    user_id: str
    project_id: str
    trust_id: str | None
    created_at: dt.datetime
    updated_at: dt.datetime | None
    lease_type: str
    priority: int
    attempts: int
    max_attempts: int | None
    next_attempt_at: dt.datetime | None
    deadline: dt.datetime | None
    hold_expires_at: dt.datetime | None
    before_end_date: dt.datetime | None
    reminders: list[int] | None
    series_id: str | None
    occurrence: dt.datetime | None
    requested_earliest_start: dt.datetime | None
    requested_latest_end: dt.datetime | None
    requested_duration_seconds: int | None
    reservations: list[ReservationRecord]
    events: list[EventRecord]


_LEASES = table_of(Lease).c
_RESERVATIONS = table_of(Reservation).c
_EVENTS = table_of(Event).c
_LEASE_COLUMNS = [_LEASES[f] for f in LeaseRecord._fields[:-2]]
_RESERVATION_COLUMNS = [_RESERVATIONS[f] for f in ReservationRecord._fields[:-4]]
_EVENT_COLUMNS = [_EVENTS[f] for f in EventRecord._fields]
_ALLOCATIONS: list[tuple[str, type[Any], Any, list[Any]]] = [
    (part, record, table_of(table).c[order], [table_of(table).c[f.name] for f in fields(record)])
    for part, record, table, order in (
        ("allocations", HostAllocationRecord, HostAllocation, "host_id"),
        ("item_allocations", ItemAllocationRecord, ItemAllocation, "item_id"),
        ("volume_allocations", VolumeAllocationRecord, VolumeAllocation, "pool_id"),
        ("instance_allocations", InstanceAllocationRecord, InstanceAllocation, "host_id"),
    )
]


def live_page(
    session: Session,
    *,
    project_id: str | None = None,
    status: str | None = None,
    name: str | None = None,
    limit: int | None = None,
    marker: Lease | None = None,
    sort_key: str = "created_at",
    descending: bool = False,
) -> list[LeaseRecord]:
    """Live leases in (``sort_key``, id) order, the ``limit`` after ``marker`` if given, each
    with its reservations (their allocations) and events."""
    column = _LEASES[sort_key]
    query = select(*_LEASE_COLUMNS).where(_LEASES.deleted_at.is_(None))
    query = query.order_by(*keyset_order(column, _LEASES.id, descending))
    if marker is not None:
        query = query.where(
            after_marker(column, _LEASES.id, getattr(marker, sort_key), marker.id, descending)
        )
    if project_id is not None:
        query = query.where(_LEASES.project_id == project_id)
    if status is not None:
        query = query.where(_LEASES.status == status)
    if name is not None:
        query = query.where(_LEASES.name == name)
    rows = session.execute(query.limit(limit)).all()
    leases = [LeaseRecord._make((*row, [], [])) for row in rows]
    by_id = {lease.id: lease for lease in leases}
    reservations: dict[str, ReservationRecord] = {}
    parts = select(*_RESERVATION_COLUMNS)
    for row in _each(session, parts, _RESERVATIONS.lease_id, by_id, _RESERVATIONS.created_at):
        reservation = ReservationRecord._make((*row, [], [], [], []))
        reservations[reservation.id] = reservation
        by_id[reservation.lease_id].reservations.append(reservation)
    events = select(*_EVENT_COLUMNS)
    for row in _each(session, events, _EVENTS.lease_id, by_id, _EVENTS.time, _EVENTS.seq):
        by_id[row.lease_id].events.append(EventRecord(*row))
    if reservations:
        for part, record, order, columns in _ALLOCATIONS:
            for row in _each(session, select(*columns), columns[0], reservations, order):
                getattr(reservations[row[0]], part).append(record(*row))
    return leases


def _each(
    session: Session, query: Select[Any], owner: Any, ids: Iterable[str], *order: Any
) -> Iterator[Any]:
    """The rows of ``query`` whose ``owner`` is one of ``ids`` in ``order`` (the ``order_by``
    of the ORM relationship they stand for, so that they come as the ORM gives them), a chunk
    of ids at a time."""
    listed = list(ids)
    for begin in range(0, len(listed), CHUNK):
        chunk = listed[begin : begin + CHUNK]
        yield from session.execute(query.where(owner.in_(chunk)).order_by(*order)).all()
