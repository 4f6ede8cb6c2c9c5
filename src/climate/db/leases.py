"""Lease, reservation and event rows."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from psycopg.errors import LockNotAvailable
from sqlalchemy import (
    ColumnElement,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    inspect,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, aliased, lazyload, selectinload
from sqlalchemy.orm.attributes import set_committed_value

from climate.db import managers, raw
from climate.db.chunks import chunked
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Base, Event, Lease, Lock, Reservation, allocations_of, table_of
from climate.db.types import among, as_utc
from climate.domain.status import (
    EVENT_ORDER,
    EventStatus,
    EventType,
    LeaseStatus,
    LeaseType,
    ReservationStatus,
)
from climate.domain.views import LeaseView
from climate.errors import Conflict

EVENTS = cast(Table, Event.__table__)
LEASES = cast(Table, Lease.__table__)
RESERVATIONS = cast(Table, Reservation.__table__)
REMINDER_PRIORITY = EVENT_ORDER[EventType.BEFORE_END_LEASE] + 1
"""The priority that marks a ``before_end_lease`` event as a reminder (a notification only)
rather than the before-end action at ``before_end_date``: at one instant it runs after every
other kind. A reminder's offset is its lease's end minus its time, kept so as the end moves."""


def reminder_ids(session: Session, events: Iterable[DueEvent]) -> set[str]:
    """Which of these due events are reminders: one query for the batch's before-end events
    (due events carry no priority, to keep the claiming queries lean)."""
    before_end = [e.id for e in events if e.event_type == EventType.BEFORE_END_LEASE]
    if not before_end:
        return set()
    query = select(Event.id).where(among(Event.id, before_end), Event.priority == REMINDER_PRIORITY)
    return set(session.scalars(query))


def reminder_events(lease: Lease) -> list[Event]:
    """The lease's reminder events (``REMINDER_PRIORITY``), in time order."""
    return [e for e in lease.events if e.priority == REMINDER_PRIORITY]


def reminder_offsets(lease: LeaseView) -> list[dt.timedelta]:
    """How long before the lease's end each of its reminders comes, longest first (as
    stored: a lease waiting or held has them before it has their events)."""
    return sorted((dt.timedelta(seconds=s) for s in lease.reminders or ()), reverse=True)


def string_rows(session: Session, rows: Sequence[Sequence[str]], width: int) -> list[Any]:
    """Columns of ``width`` strings, one row per item of ``rows``, read from one JSON parameter:
    the source of an ``INSERT ... SELECT`` that writes thousands of rows in one statement."""
    payload = literal(json.dumps([list(row) for row in rows]))
    if session.get_bind().dialect.name == "postgresql":
        items = func.jsonb_array_elements(cast_(payload, JSONB)).table_valued("value")
        return [items.c.value.op("->>")(literal(i)) for i in range(width)]
    items = func.json_each(payload).table_valued("value")
    return [func.json_extract(items.c.value, f"$[{i}]") for i in range(width)]


def get(
    session: Session,
    lease_id: str,
    *,
    project_id: str | None = None,
    locked: bool = False,
    whole: bool = True,
) -> Lease | None:
    """A live (not deleted) lease; with ``project_id``, only if it belongs to that project.
    ``whole``: with its reservations, their allocations and its events; else the lease and its
    reservations, the rest read when first used (a check that looks at the reservations).

    ``locked``: its row is locked for this transaction and read afresh once the lock is had
    (PostgreSQL), so a status a manager committed meanwhile is the one seen, never overwritten.
    SQLite's write transactions begin IMMEDIATE: nobody commits while one runs, so what it has
    read is current, and a lease it has loaded is not loaded again (a query would: SQLAlchemy
    runs the eager loads of its rows again).
    """
    options = _WHOLE if whole else _PART
    if locked and session.get_bind().dialect.name == "sqlite":
        found = session.get(Lease, lease_id, options=options)
        if found is None or found.deleted_at is not None:
            return None
        if whole:
            _load_allocations(session, found.reservations, again=False)
        return found if project_id is None or found.project_id == project_id else None
    query = select(Lease).where(Lease.id == lease_id, Lease.deleted_at.is_(None))
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    if locked:
        query = query.with_for_update().execution_options(populate_existing=True)
    lease = session.scalars(query.options(*options)).first()
    if lease is not None and whole:
        _load_allocations(session, lease.reservations, again=locked)
    return lease


_ALLOCATIONS = (
    Reservation.allocations,
    Reservation.instance_allocations,
    Reservation.volume_allocations,
    Reservation.item_allocations,
)
_WHOLE = (selectinload(Lease.reservations).options(*(lazyload(r) for r in _ALLOCATIONS)),)
_PART = (lazyload(Lease.events), selectinload(Lease.reservations).lazyload("*"))


def _load_allocations(
    session: Session, reservations: Sequence[Reservation], *, again: bool
) -> None:
    """Fill the reservations' four allocation collections (those not loaded yet, or all of
    them ``again``), reading only the table each one's type has: a host lease's load then runs
    one allocation query, not four."""
    for relation in _ALLOCATIONS:
        filled = [r for r in reservations if again or relation.key in inspect(r).unloaded]
        if not filled:
            continue
        held: dict[str, list[Any]] = {r.id: [] for r in filled}
        using = [r.id for r in filled if allocations_of(r.resource_type) == relation.key]
        if using:
            model = relation.property.mapper.class_
            query = (
                select(model)
                .where(model.reservation_id.in_(using))
                .order_by(*relation.property.order_by)
            )
            for row in session.scalars(query):
                held[row.reservation_id].append(row)
        for reservation in filled:
            set_committed_value(reservation, relation.key, held[reservation.id])


def reservation(session: Session, reservation_id: str) -> Reservation:
    """A reservation an allocation names (its foreign key holds it).

    :raises LookupError: it is gone all the same."""
    found = session.get(Reservation, reservation_id)
    if found is None:
        raise LookupError(f"reservation {reservation_id}")
    return found


def get_for_update(session: Session, lease_id: str) -> Lease | None:
    query = select(Lease).where(Lease.id == lease_id).with_for_update()
    return session.scalars(query).first()


LEASE_SORT_KEYS = ("created_at", "name", "start_date", "end_date", "status", "id")


def keyset_order(column: Any, id_column: Any, descending: bool) -> list[Any]:
    """A stable order: by ``column``, ties by id, both in the same direction."""
    return [column.desc(), id_column.desc()] if descending else [column, id_column]


def after_marker(
    column: Any, id_column: Any, value: object, marker_id: object, descending: bool
) -> ColumnElement[bool]:
    """The rows after (``value``, ``marker_id``) in ``keyset_order``: pages stay consistent
    however rows are added between requests, and no row is read twice."""
    if descending:
        return or_(column < value, and_(column == value, id_column < marker_id))
    return or_(column > value, and_(column == value, id_column > marker_id))


_LEASES = table_of(Lease).c
_NAME_TAKEN = (
    select(_LEASES.id)
    .where(
        _LEASES.project_id == bindparam("project_id"),
        _LEASES.name == bindparam("name"),
        _LEASES.deleted_at.is_(None),
        _LEASES.id != bindparam("other_than"),
    )
    .limit(1)
)


def name_taken(session: Session, project_id: str, name: str, *, other_than: str = "") -> bool:
    found = session.execute(
        _NAME_TAKEN, {"project_id": project_id, "name": name, "other_than": other_than}
    )
    return found.first() is not None


_ADD_LEASE = insert(table_of(Lease))
_ADD_RESERVATIONS = insert(table_of(Reservation))
_ADD_EVENTS = insert(table_of(Event))


LIVE_NAME = "uq_leases_live_name"
LIVE_NAME_COLUMNS = "leases.project_id, leases.name"
"""How SQLite names the index in its error (PostgreSQL gives the index's name)."""


def insert_new(session: Session, lease: Lease) -> None:
    """Write a new lease with its reservations and events: one Core insert per table.

    :raises Conflict: the project has a live lease of that name (the database's unique index
        decides; on PostgreSQL an insert of the same name by a transaction still open waits
        for it to end).

    The objects stay outside the session, as built (every column set): the caller renders them
    without a reload, and the unit of work has nothing to track.
    """
    try:
        raw.write(session, _ADD_LEASE, [_columns(lease)])
    except IntegrityError as error:
        if not _name_clash(error):
            raise
        raise Conflict(
            f"name: a lease named {lease.name!r} already exists in project {lease.project_id}"
        ) from None
    raw.write(session, _ADD_RESERVATIONS, [_columns(r) for r in lease.reservations])
    raw.write(session, _ADD_EVENTS, [_columns(e) for e in lease.events])


def _name_clash(error: IntegrityError) -> bool:
    """Whether ``error`` is another live lease of the project holding the name."""
    constraint = getattr(getattr(error.orig, "diag", None), "constraint_name", None)
    return constraint == LIVE_NAME or LIVE_NAME_COLUMNS in str(error.orig)


def _columns(row: Base) -> dict[str, Any]:
    # A new row's attributes are all in its __dict__ (None where never set, as getattr says).
    attributes = row.__dict__
    return {key: attributes.get(key) for key in _column_keys(type(row))}


@functools.cache
def _column_keys(model: type[Base]) -> tuple[str, ...]:
    return tuple(column.key for column in table_of(model).columns)


_HELD_LEASES = "held_leases"
"""``session.info`` key: the leases ``hold_waiting_events`` loaded whole (SQLite)."""


def hold_waiting_events(session: Session, lease_id: str) -> list[Event]:
    """The lease's waiting events, locked in lifecycle order (PostgreSQL; SQLite writers are
    serialised anyway): no manager can take them until this transaction ends. An API change to
    a lease calls this before it reads or writes anything else of the lease.

    A manager taking one of them is waited for, and the event is then left out (it is no longer
    waiting); an event already claimed is not waited for. The caller locks the lease's row only
    after this (``get(locked=True)``): a manager holding the row holds claimed events only and
    never asks for a waiting one, so that wait closes no cycle; and the caller never locks a
    lease's events in another order than a manager taking them (head first).
    """
    key = session.identity_key(Lease, lease_id)
    if session.get_bind().dialect.name == "sqlite" and key not in session.identity_map:
        # Nothing to lock: the lease is loaded whole at once, and the caller's ``get`` finds
        # it loaded (its events are read once, not twice).
        lease = session.get(Lease, lease_id, options=_WHOLE)
        if lease is None:
            return []
        # The identity map holds what is unchanged weakly: kept for the transaction, or it is
        # gone (and loaded again) by the time the caller asks.
        session.info.setdefault(_HELD_LEASES, []).append(lease)
        waiting = (e for e in lease.events if e.status == EventStatus.UNDONE)
        return sorted(waiting, key=lambda e: (e.seq, e.id))
    query = (
        select(Event)
        .where(Event.lease_id == lease_id, Event.status == EventStatus.UNDONE)
        .order_by(Event.seq, Event.id)
        .with_for_update()
    )
    return list(session.scalars(query))


PENDING_EVENT = (EventStatus.UNDONE, EventStatus.IN_PROGRESS)
"""An event in one of these has not happened yet: later events of its lease wait for it."""


@dataclass(frozen=True, slots=True)
class DueEvent:
    """A due event as the manager claims it; no timestamps (parsing them costs more than the
    rest of the row, and the order comes from the query)."""

    id: str
    lease_id: str
    event_type: str
    status: str
    seq: int
    rank: int
    """Position among the events of its ``round`` in run order (time, then same-time order)."""
    round: int
    """0 for the first waiting event of its lease, 1 for the one after it, and so on."""


def runnable_now(now: dt.datetime, alive_since: dt.datetime) -> ColumnElement[bool]:
    """Due and free to take: waiting and due, or claimed by a manager that is gone: one that
    heartbeats and has not since ``alive_since`` (wall clock), or one that does not and whose
    claim expired. A heartbeating manager's claim is never taken while it beats, however long
    its backend call takes."""
    return or_(
        (Event.status == EventStatus.UNDONE) & (Event.not_before <= now),
        (Event.status == EventStatus.IN_PROGRESS)
        & or_(
            managers.dead(Event.claimed_by, alive_since),
            ~managers.registered(Event.claimed_by) & (Event.claimed_until <= now),
        ),
    )


def due_events(
    session: Session, now: dt.datetime, limit: int, *, alive_since: dt.datetime
) -> list[DueEvent]:
    """Events that may run now, and the order they run in (``alive_since``: see ``runnable``).

    First the *heads*: due events whose lease has no earlier event (``seq``) still waiting or
    running, in order of time then same-time order (ends before starts), at most ``limit``. Then,
    for each head, the events of its lease that follow it and are due as well (round 1, 2): a
    lease's start, before-end and end due at the same instant are taken in one pass, and the
    manager runs each only after the earlier ones of its lease succeeded in that pass. A chain
    stops at the first event that is not due (or is claimed by a live manager), so no event is
    ever taken while an earlier event of its lease is pending and not taken with it.

    On PostgreSQL the heads are locked ``FOR UPDATE SKIP LOCKED`` (another manager takes other
    heads) and their followers ``FOR UPDATE``: only the holder of a head can take its followers.
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    runnable = runnable_now(now, alive_since)
    earlier = aliased(Event)
    waiting_on_earlier = (
        select(earlier.id)
        .where(
            earlier.lease_id == Event.lease_id,
            earlier.seq < Event.seq,
            earlier.status.in_(PENDING_EVENT),
        )
        .exists()
    )
    heads_query = (
        select(Event.id, Event.lease_id, Event.event_type, Event.status, Event.seq)
        .where(runnable, ~waiting_on_earlier)
        .order_by(Event.time, Event.priority, Event.id)
        .limit(limit)
    )
    if postgres:
        heads_query = heads_query.with_for_update(skip_locked=True, of=Event)
    heads = [
        DueEvent(id, lease_id, kind, status, seq, rank, 0)
        for rank, (id, lease_id, kind, status, seq) in enumerate(session.execute(heads_query))
    ]
    if not heads:
        return []
    head_of = {e.lease_id: e for e in heads}
    if len(head_of) < len(heads):
        # Two heads of one lease (equal seq): no followers for that lease in this pass.
        twice = {lid for lid in head_of if sum(e.lease_id == lid for e in heads) > 1}
        head_of = {lid: e for lid, e in head_of.items() if lid not in twice}
    rest_query = (
        select(
            Event.id,
            Event.lease_id,
            Event.event_type,
            Event.status,
            Event.seq,
            case((runnable, True), else_=False),
        )
        .where(among(Event.lease_id, head_of), Event.status.in_(PENDING_EVENT))
        .order_by(Event.time, Event.priority, Event.id)
    )
    if postgres:
        rest_query = rest_query.with_for_update(of=Event)
    by_lease: dict[str, list[tuple[int, int, str, str, str, bool]]] = defaultdict(list)
    for rank, (id, lease_id, kind, status, seq, ok) in enumerate(session.execute(rest_query)):
        by_lease[lease_id].append((seq, rank, id, kind, status, bool(ok)))
    followers: list[DueEvent] = []
    for lease_id, rows in by_lease.items():
        head = head_of[lease_id]
        rows.sort()
        chain = 0
        for seq, rank, id, kind, status, ok in rows:
            if id == head.id:
                continue
            if not ok or seq <= head.seq:
                break  # not due yet, claimed by another manager, or a tie with the head
            chain += 1
            followers.append(DueEvent(id, lease_id, kind, status, seq, rank, chain))
    return heads + followers


def claim(
    session: Session, event_ids: Sequence[str], owner: str, now: dt.datetime, until: dt.datetime
) -> None:
    """Take the events selected by ``due_events`` in this same transaction (they are locked:
    SKIP LOCKED on PostgreSQL, the write lock on SQLite)."""
    if not event_ids:
        return
    session.execute(
        update(EVENTS)
        .where(among(EVENTS.c.id, event_ids))
        .values(
            status=EventStatus.IN_PROGRESS,
            claimed_by=owner,
            claimed_until=until,
            attempts=EVENTS.c.attempts + 1,
            updated_at=now,
        )
    )


def owners(session: Session, lease_ids: Collection[str]) -> dict[str, tuple[str, str]]:
    """Each lease's project and user (which never change), deleted leases too."""
    found: dict[str, tuple[str, str]] = {}
    wanted = sorted(lease_ids)
    for chunk in chunked(wanted):
        query = select(Lease.id, Lease.project_id, Lease.user_id).where(Lease.id.in_(chunk))
        found.update(
            (lease_id, (project, user)) for lease_id, project, user in session.execute(query)
        )
    return found


_ADMISSION_VERSION = select(table_of(Lock).c.version).where(table_of(Lock).c.name == ADMISSION_LOCK)


def admission_version(session: Session) -> int:
    """The last committed admission's number, as ``session`` sees it. Bumped by every API
    transaction that changes leases, reservations, allocations or hosts (they all take the
    admission lock); the manager's own writes leave it alone. A transaction holding the lock
    sees its own bump, not committed yet: its number is the one before."""
    held = session.info.get("lock_version")
    if held is not None:
        return int(held) - 1
    found = raw.rows(session, _ADMISSION_VERSION, {})  # below the ORM: read by every search
    return int(found[0][0] or 0) if found else 0


EVENTS_CHANNEL = "climate_events"


def signal_event_change(session: Session, earliest: dt.datetime) -> None:
    """Wake managers in other processes at commit (PostgreSQL NOTIFY with the earliest changed
    event's time as payload; SQLite managers watch the database's change counter instead)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_notify(EVENTS_CHANNEL, as_utc(earliest).isoformat())))


def lock_lease(session: Session, lease_id: str) -> Lease | None:
    """A live lease for an operator's change, its events and row locked without waiting
    (PostgreSQL; SQLite writers are serialised anyway). The manager locks a lease's events and
    row in either order depending on the path, so waiting could deadlock with it.

    :raises Conflict: a manager holds some of them right now.
    """
    try:
        session.execute(
            select(Event.id).where(Event.lease_id == lease_id).with_for_update(nowait=True)
        )
        query = select(Lease).where(Lease.id == lease_id, Lease.deleted_at.is_(None))
        return session.scalars(query.with_for_update(nowait=True)).first()
    except OperationalError as exc:
        if isinstance(exc.orig, LockNotAvailable):
            raise Conflict(
                f"lease {lease_id}: a manager is working on it; try again in a moment"
            ) from exc
        raise


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting lease as the queue sees it."""

    id: str
    lease_type: str
    deadline: dt.datetime | None
    next_attempt_at: dt.datetime | None


QUEUE_ORDER = (Lease.priority.desc(), Lease.created_at, Lease.id)
"""The waiting queue's order: higher priority first, then earlier request, then id."""


def waiting(session: Session) -> list[Waiting]:
    """Every waiting (IN_PROGRESS) lease, in queue order."""
    query = (
        select(Lease.id, Lease.lease_type, Lease.deadline, Lease.next_attempt_at)
        .where(Lease.status == LeaseStatus.IN_PROGRESS, Lease.deleted_at.is_(None))
        .order_by(*QUEUE_ORDER)
    )
    return [Waiting(*row) for row in session.execute(query)]


def queue_places(session: Session) -> dict[str, int]:
    """Each waiting lease's place in the queue, from 1, across every project."""
    return {row.id: i for i, row in enumerate(waiting(session), start=1)}


_QUEUE_WAITS = (
    select(_LEASES.id)
    .where(_LEASES.status == LeaseStatus.IN_PROGRESS, _LEASES.deleted_at.is_(None))
    .limit(1)
)


_RESERVATIONS = table_of(Reservation).c
_ENDED_RESERVATION = (
    select(_RESERVATIONS.id)
    .where(
        _RESERVATIONS.lease_id == bindparam("lease_id"),
        _RESERVATIONS.status == ReservationStatus.DELETED,
    )
    .limit(1)
)


def has_ended_reservation(session: Session, lease_id: str) -> bool:
    """Whether a reservation of the lease has ended (status ``deleted``), whatever the lease's
    project: only such a one can still keep what it held (``end_policy`` keep-until-ack)."""
    return bool(raw.rows(session, _ENDED_RESERVATION, {"lease_id": lease_id}))


def queue_waits(session: Session) -> bool:
    """Whether a lease waits for capacity (every change that frees some asks)."""
    return bool(raw.rows(session, _QUEUE_WAITS, {}))


def lapsed_holds(session: Session, now: dt.datetime) -> list[str]:
    query = select(Lease.id).where(
        Lease.status == LeaseStatus.HELD,
        Lease.deleted_at.is_(None),
        Lease.hold_expires_at <= now,
    )
    return list(session.scalars(query.order_by(Lease.hold_expires_at, Lease.id)))


def queue_timers(session: Session) -> tuple[dt.datetime | None, bool]:
    """When the queue next has something to do by the clock (a retry's next attempt, a
    best-effort deadline, a hold's expiry), and whether best-effort leases are waiting."""
    live = Lease.deleted_at.is_(None)
    waiting_now = and_(live, Lease.status == LeaseStatus.IN_PROGRESS)
    attempt, deadline, hunting = session.execute(
        select(
            func.min(Lease.next_attempt_at),
            func.min(Lease.deadline),
            func.count(Lease.id).filter(Lease.lease_type == LeaseType.BEST_EFFORT),
        ).where(waiting_now)
    ).one()
    expiry = session.scalar(
        select(func.min(Lease.hold_expires_at)).where(live, Lease.status == LeaseStatus.HELD)
    )
    times = [as_utc(v) for v in (attempt, deadline, expiry) if v is not None]
    return (min(times) if times else None), bool(hunting)
