"""Lease, reservation and event rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import delete, func, or_, select, text, update
from sqlalchemy.orm import Session, aliased, selectinload

from climate.db.tables import Event, Lease
from climate.db.types import as_utc
from climate.domain.status import EventStatus


def get(session: Session, lease_id: str, *, project_id: str | None = None) -> Lease | None:
    """A live (not deleted) lease; with ``project_id``, only if it belongs to that project."""
    query = select(Lease).where(Lease.id == lease_id, Lease.deleted_at.is_(None))
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    return session.scalars(query).first()


def get_for_update(session: Session, lease_id: str) -> Lease | None:
    query = select(Lease).where(Lease.id == lease_id).with_for_update()
    return session.scalars(query).first()


def list_live(
    session: Session,
    *,
    project_id: str | None = None,
    status: str | None = None,
    name: str | None = None,
) -> Sequence[Lease]:
    query = select(Lease).where(Lease.deleted_at.is_(None)).order_by(Lease.created_at, Lease.id)
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    if status is not None:
        query = query.where(Lease.status == status)
    if name is not None:
        query = query.where(Lease.name == name)
    return session.scalars(query).all()


def name_taken(session: Session, project_id: str, name: str, *, other_than: str = "") -> bool:
    query = (
        select(func.count())
        .select_from(Lease)
        .where(
            Lease.project_id == project_id,
            Lease.name == name,
            Lease.deleted_at.is_(None),
            Lease.id != other_than,
        )
    )
    return bool(session.scalar(query))


def add(session: Session, lease: Lease) -> Lease:
    session.add(lease)
    session.flush()
    return lease


def drop_pending_events(session: Session, lease_id: str) -> None:
    session.execute(
        delete(Event).where(Event.lease_id == lease_id, Event.status == EventStatus.UNDONE)
    )


def next_due(session: Session) -> dt.datetime | None:
    """When the earliest waiting event may run (including claims that will expire)."""
    undone = session.scalar(
        select(func.min(Event.not_before)).where(Event.status == EventStatus.UNDONE)
    )
    stale = session.scalar(
        select(func.min(Event.claimed_until)).where(Event.status == EventStatus.IN_PROGRESS)
    )
    candidates = [as_utc(v) for v in (undone, stale) if v is not None]
    return min(candidates) if candidates else None


def due_events(session: Session, now: dt.datetime, limit: int) -> Sequence[Event]:
    """Events that may run now, in order: time, then same-time order; an event whose lease still
    has an earlier event to run waits for it."""
    earlier = aliased(Event)
    waiting_on_earlier = (
        select(earlier.id)
        .where(
            earlier.lease_id == Event.lease_id,
            earlier.seq < Event.seq,
            earlier.status.in_([EventStatus.UNDONE, EventStatus.IN_PROGRESS]),
        )
        .exists()
    )
    query = (
        select(Event)
        .where(
            or_(
                (Event.status == EventStatus.UNDONE) & (Event.not_before <= now),
                (Event.status == EventStatus.IN_PROGRESS) & (Event.claimed_until <= now),
            ),
            ~waiting_on_earlier,
        )
        .order_by(Event.time, Event.priority, Event.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True, of=Event)
    return session.scalars(query).all()


def claim(
    session: Session, event_ids: Sequence[str], owner: str, now: dt.datetime, until: dt.datetime
) -> None:
    """Take the events selected by ``due_events`` in this same transaction (they are locked:
    SKIP LOCKED on PostgreSQL, the write lock on SQLite)."""
    if not event_ids:
        return
    session.execute(
        update(Event)
        .where(Event.id.in_(list(event_ids)))
        .values(
            status=EventStatus.IN_PROGRESS,
            claimed_by=owner,
            claimed_until=until,
            attempts=Event.attempts + 1,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )


def events_with_leases(session: Session, event_ids: Sequence[str]) -> list[Event]:
    """The events, in execution order, with their leases (reservations, allocations) loaded."""
    found = session.scalars(
        select(Event)
        .where(Event.id.in_(list(event_ids)))
        .options(selectinload(Event.lease))
        .order_by(Event.time, Event.priority, Event.id)
    ).all()
    return list(found)


EVENTS_CHANNEL = "climate_events"


def signal_event_change(session: Session) -> None:
    """Wake managers in other processes at commit (PostgreSQL NOTIFY; SQLite managers watch the
    database's change counter instead)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"NOTIFY {EVENTS_CHANNEL}"))
