"""A page of live leases, read for showing only: plain records in a few statements, with no ORM
objects. Listing a thousand leases through the ORM (a lease, its reservations, events and
allocations: about six objects each, every one with its identity-map state) cost several times
reading the same rows as tuples. The records have the shapes of ``climate.domain.views``, as
the ORM rows do, and come in the order the ORM relationships give."""

from __future__ import annotations

import dataclasses
import datetime as dt
import weakref
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from sqlalchemy import Select, bindparam, func, select, text
from sqlalchemy.orm import Session

from climate.db import raw
from climate.db.chunks import chunked
from climate.db.leases import after_marker, keyset_order
from climate.db.tables import (
    Event,
    HostAllocation,
    InstanceAllocation,
    ItemAllocation,
    Lease,
    LeaseRevision,
    Reservation,
    VolumeAllocation,
    allocations_of,
    table_of,
)
from climate.db.types import in_listed


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
_REVISIONS = table_of(LeaseRevision).c
_COUNTED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_LAST_CHANGE = select(func.coalesce(func.max(_REVISIONS.seq), 0))
_LEASE_COLUMNS = [_LEASES[f] for f in LeaseRecord._fields[:-2]]
_RESERVATION_COLUMNS = [_RESERVATIONS[f] for f in ReservationRecord._fields[:-4]]
_EVENT_COLUMNS = [_EVENTS[f] for f in EventRecord._fields]
_LEASES_OF = select(*_LEASE_COLUMNS).where(in_listed(_LEASES.id, "ids"))
# The parts of a lease, each read for many leases by one statement built once, in the order of
# the ORM relationship it stands for (the order the ORM gives them in).
_RESERVATIONS_OF = (
    select(*_RESERVATION_COLUMNS)
    .where(in_listed(_RESERVATIONS.lease_id, "ids"))
    .order_by(_RESERVATIONS.created_at)
)
_EVENTS_OF = (
    select(*_EVENT_COLUMNS)
    .where(in_listed(_EVENTS.lease_id, "ids"))
    .order_by(_EVENTS.time, _EVENTS.seq)
)
_ALLOCATIONS_OF: list[tuple[str, type[Any], Select[Any]]] = [
    (
        part,
        record,
        select(*(table_of(table).c[f.name] for f in fields(record)))
        .where(in_listed(table_of(table).c.reservation_id, "ids"))
        .order_by(table_of(table).c[order]),
    )
    for part, record, table, order in (
        ("allocations", HostAllocationRecord, HostAllocation, "host_id"),
        ("item_allocations", ItemAllocationRecord, ItemAllocation, "item_id"),
        ("volume_allocations", VolumeAllocationRecord, VolumeAllocation, "pool_id"),
        ("instance_allocations", InstanceAllocationRecord, InstanceAllocation, "host_id"),
    )
]


@dataclass(frozen=True)
class Asked:
    """A page of live leases: those of ``project_id`` (None: of every project), with
    ``status`` and ``name`` if given, in (``sort_key``, id) order, the ``limit`` after
    ``marker`` if given."""

    project_id: str | None = None
    status: str | None = None
    name: str | None = None
    limit: int | None = None
    marker: Lease | None = None
    sort_key: str = "created_at"
    descending: bool = False


def live_page(session: Session, asked: Asked) -> list[LeaseRecord]:
    """The leases ``asked``, each with its reservations (their allocations) and events."""
    query = _page(select(*_LEASE_COLUMNS), asked)
    return _complete(session, session.execute(query.limit(asked.limit)).all())


class Listed(NamedTuple):
    """A lease of a page, as ``revisions`` lists it."""

    id: str
    status: str
    revision: int
    key: Any
    """Its value of the page's ``sort_key``."""


def revisions(session: Session, asked: Asked) -> list[Listed] | None:
    """The leases ``live_page`` would load, in its order, each with its status, revision
    (``lease_revisions``; 0 without a row) and sort key; None where the database does not count
    revisions (no trigger: PostgreSQL)."""
    if not counts(session):
        return None
    query = _page(_revised(_LEASES[asked.sort_key]), asked).limit(asked.limit)
    # On the connection: the ORM's row loading cost more than the query (a page of 1,000).
    return list(map(Listed._make, session.connection().execute(query).all()))


def revisions_after(session: Session, asked: Asked, last: Listed, count: int) -> list[Listed]:
    """The ``count`` leases ``revisions`` lists after ``last`` (a lease of its page, whatever
    became of it since), as they are now."""
    column = _LEASES[asked.sort_key]
    beyond = after_marker(column, _LEASES.id, last.key, last.id, asked.descending)
    query = _page(_revised(column), dataclasses.replace(asked, marker=None)).where(beyond)
    return list(map(Listed._make, session.connection().execute(query.limit(count)).all()))


def last_change(session: Session) -> int:
    """The sequence number of the last change to any lease (``lease_revisions.seq``; 0: none),
    where the database counts revisions (``counts``)."""
    return int(session.connection().execute(_LAST_CHANGE).scalar_one())


class Changed(NamedTuple):
    """A lease as ``changed_since`` finds it."""

    id: str
    live: bool
    """False: deleted (or gone)."""
    status: str
    revision: int
    project_id: str
    name: str
    key: Any
    """Its value of the ``sort_key`` asked."""


def changed_since(session: Session, seq: int, sort_key: str, most: int) -> list[Changed] | None:
    """The leases changed after change ``seq`` (``last_change``), in no order; None when there
    are more than ``most``. Where the database counts revisions (``counts``)."""
    query = (
        select(
            _REVISIONS.lease_id,
            _LEASES.id,
            _LEASES.deleted_at,
            _LEASES.status,
            _REVISIONS.revision,
            _LEASES.project_id,
            _LEASES.name,
            _LEASES[sort_key],
        )
        .outerjoin_from(table_of(LeaseRevision), table_of(Lease), _LEASES.id == _REVISIONS.lease_id)
        .where(_REVISIONS.seq > seq)
        .limit(most + 1)
    )
    rows = session.connection().execute(query).all()
    if len(rows) > most:
        return None
    return [
        Changed(lease_id, found is not None and deleted is None, *rest)
        for lease_id, found, deleted, *rest in rows
    ]


class Owned(NamedTuple):
    """A lease as ``revision_of`` finds it."""

    id: str
    status: str
    revision: int
    project_id: str
    user_id: str


def revision_of(session: Session, lease_id: str, project_id: str | None = None) -> Owned | None:
    """Live lease ``lease_id`` (of ``project_id`` if given) with its status, revision and owners;
    None when it is not found. Only where the database counts revisions (``counts``)."""
    found = raw.rows(session, _REVISION_OF, {"lease_id": lease_id})
    if not found or project_id not in (None, found[0][3]):
        return None
    return Owned._make(found[0])


def by_ids(session: Session, ids: Collection[str]) -> dict[str, LeaseRecord]:
    """Leases ``ids`` (those found), each as ``live_page`` loads it."""
    rows: list[Any] = []
    for chunk in chunked(sorted(ids)):
        rows += session.execute(_LEASES_OF, {"ids": chunk}).all()
    return {lease.id: lease for lease in _complete(session, rows)}


def counts(session: Session) -> bool:
    """Whether the database counts lease revisions (SQLite's triggers, migration 0023), asked
    once per engine."""
    engine = session.get_bind().engine  # a writer's session is bound to its connection
    counted = _COUNTED.get(engine)
    if counted is None:
        counted = engine.dialect.name == "sqlite" and bool(
            session.execute(
                text("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name GLOB :n"),
                {"n": "lease_revision_*"},
            ).scalar_one()
        )
        _COUNTED[engine] = counted
    return counted


def _revised(*more: Any) -> Select[Any]:
    """Leases' ids, statuses and revisions (0 without a row), then ``more`` of their columns."""
    counted = func.coalesce(_REVISIONS.revision, 0)
    return select(_LEASES.id, _LEASES.status, counted, *more).outerjoin_from(
        table_of(Lease), table_of(LeaseRevision), _REVISIONS.lease_id == _LEASES.id
    )


_REVISION_OF = _revised(_LEASES.project_id, _LEASES.user_id).where(
    _LEASES.id == bindparam("lease_id"), _LEASES.deleted_at.is_(None)
)
"""Built once: every ``GET /v1/leases/{id}`` asks."""


def _page(query: Select[Any], asked: Asked) -> Select[Any]:
    column, descending, marker = _LEASES[asked.sort_key], asked.descending, asked.marker
    query = query.where(_LEASES.deleted_at.is_(None))
    query = query.order_by(*keyset_order(column, _LEASES.id, descending))
    if marker is not None:
        value = getattr(marker, asked.sort_key)
        query = query.where(after_marker(column, _LEASES.id, value, marker.id, descending))
    if asked.project_id is not None:
        query = query.where(_LEASES.project_id == asked.project_id)
    if asked.status is not None:
        query = query.where(_LEASES.status == asked.status)
    if asked.name is not None:
        query = query.where(_LEASES.name == asked.name)
    return query


def _complete(session: Session, rows: Sequence[Any]) -> list[LeaseRecord]:
    """Leases of these rows (``_LEASE_COLUMNS``), each with its reservations (their
    allocations: each read from the one table its type has) and events."""
    leases = [LeaseRecord._make((*row, [], [])) for row in rows]
    by_id = {lease.id: lease for lease in leases}
    reservations: dict[str, ReservationRecord] = {}
    for row in _each(session, _RESERVATIONS_OF, list(by_id)):
        reservation = ReservationRecord._make((*row, [], [], [], []))
        reservations[reservation.id] = reservation
        by_id[reservation.lease_id].reservations.append(reservation)
    for row in _each(session, _EVENTS_OF, list(by_id)):
        by_id[row.lease_id].events.append(EventRecord(*row))
    for part, record, statement in _ALLOCATIONS_OF:
        using = [r.id for r in reservations.values() if allocations_of(r.resource_type) == part]
        for row in _each(session, statement, using):
            getattr(reservations[row[0]], part).append(record(*row))
    return leases


def _each(session: Session, statement: Select[Any], ids: Sequence[str]) -> Iterator[Any]:
    """The rows of ``statement`` for ``ids`` (its ``ids`` parameter), a chunk at a time."""
    for chunk in chunked(ids):
        yield from session.execute(statement, {"ids": chunk}).all()
