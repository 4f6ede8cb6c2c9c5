"""The manager's event rows: when the next is due, planned chains, claims and their outcomes."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Collection
from typing import cast

from sqlalchemy import case, func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, lazyload, selectinload

from climate.db import managers
from climate.db.leases import (
    EVENTS,
    LEASES,
    PENDING_EVENT,
    RESERVATIONS,
    DueEvent,
)
from climate.db.tables import Event, Lease, Reservation
from climate.db.types import among, as_utc
from climate.domain.status import EventStatus


def next_due(session: Session) -> dt.datetime | None:
    """When the earliest waiting event may run, including claims that will expire (those of
    managers that do not heartbeat; ``managers.oldest_claimer_beat`` tells about the others)."""
    undone = session.scalar(
        select(func.min(Event.not_before)).where(Event.status == EventStatus.UNDONE)
    )
    stale = session.scalar(
        select(func.min(Event.claimed_until)).where(
            Event.status == EventStatus.IN_PROGRESS, ~managers.registered(Event.claimed_by)
        )
    )
    candidates = [as_utc(v) for v in (undone, stale) if v is not None]
    return min(candidates) if candidates else None


def chains_due_by(session: Session, when: dt.datetime, limit: int) -> list[DueEvent]:
    """What ``due_events`` will take at ``when`` if nothing changes until then, read ahead of
    time: for each lease with a waiting event due by ``when`` (at most ``limit`` leases, the
    soonest first), its pending events in lifecycle order as long as they are waiting and due by
    then. A lease whose first pending event is not waiting and due (another manager runs it, or
    it is due later), or with two pending events of one ``seq``, is left out: ``due_events``
    will see to it when the time comes."""
    due_by = (Event.status == EventStatus.UNDONE) & (Event.not_before <= when)
    leases = (
        select(Event.lease_id)
        .where(due_by)
        .group_by(Event.lease_id)
        .order_by(func.min(Event.not_before))
        .limit(limit)
    )
    query = (
        select(
            Event.id,
            Event.lease_id,
            Event.event_type,
            Event.status,
            Event.seq,
            case((due_by, True), else_=False),
        )
        .where(Event.lease_id.in_(leases.scalar_subquery()), Event.status.in_(PENDING_EVENT))
        .order_by(Event.time, Event.priority, Event.id)
    )
    by_lease: dict[str, list[tuple[int, int, str, str, str, bool]]] = defaultdict(list)
    for rank, (id, lease_id, kind, status, seq, ok) in enumerate(session.execute(query)):
        by_lease[lease_id].append((seq, rank, id, kind, status, bool(ok)))
    chains: list[DueEvent] = []
    for lease_id, rows in by_lease.items():
        rows.sort()
        if len({row[0] for row in rows}) < len(rows):
            continue
        for place, (seq, rank, id, kind, status, ok) in enumerate(rows):
            if not ok:
                break
            chains.append(DueEvent(id, lease_id, kind, status, seq, rank, place))
    return chains


def take_waiting(session: Session, event_ids: Collection[str], now: dt.datetime) -> int:
    """How many of ``event_ids`` are still waiting and due; on PostgreSQL they are locked for
    this transaction (SKIP LOCKED: one another manager is taking is not counted)."""
    if not event_ids:
        return 0
    query = select(Event.id).where(
        among(Event.id, event_ids),
        Event.status == EventStatus.UNDONE,
        Event.not_before <= now,
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
        return len(session.execute(query).all())
    return int(session.scalar(select(func.count()).select_from(query.subquery())) or 0)


def lost_claims(session: Session, event_ids: Collection[str], owner: str) -> set[str]:
    """Those of ``event_ids`` that ``owner`` no longer holds (another manager took the event
    over); usually none, so nothing comes back.

    On PostgreSQL the events are locked for the rest of the transaction, which runs them: from
    here to its commit no other manager can take them over (``due_events`` skips locked heads),
    even should this manager's heartbeat fall behind. If the process dies, the lock goes with
    its connection."""
    if not event_ids:
        return set()
    rows = session.execute(
        select(Event.id, Event.status, Event.claimed_by)
        .where(among(Event.id, event_ids))
        .with_for_update()
    )
    return {
        id
        for id, status, claimed_by in rows
        if status != EventStatus.IN_PROGRESS or claimed_by != owner
    }


def expire_claims(session: Session, now: dt.datetime) -> int:
    """End every event claim now (their managers are known to be gone); returns how many. The
    events are then taken over like any expired claim."""
    result = session.execute(
        update(EVENTS)
        .where(EVENTS.c.status == EventStatus.IN_PROGRESS)
        .values(claimed_until=now, updated_at=now)
    )
    return int(cast(CursorResult[object], result).rowcount)


def claim_holders(session: Session, event_ids: Collection[str]) -> dict[str, tuple[str, int]]:
    """Who holds the claim of each of these events, and its attempts so far (each claim
    counts one)."""
    if not event_ids:
        return {}
    query = select(Event.id, Event.claimed_by, Event.attempts).where(among(Event.id, event_ids))
    return {id: (holder or "", attempts) for id, holder, attempts in session.execute(query)}


def claimed_by(session: Session, owner: str) -> list[str]:
    """The events ``owner`` holds now (claimed, not finished)."""
    query = select(EVENTS.c.id).where(
        EVENTS.c.status == EventStatus.IN_PROGRESS, EVENTS.c.claimed_by == owner
    )
    return list(session.scalars(query))


def unclaim(session: Session, event_ids: Collection[str], owner: str, now: dt.datetime) -> None:
    """Give back claimed events that were not run (an earlier event of their lease failed in
    the same pass): waiting again, and the claim does not count as an attempt."""
    if not event_ids:
        return
    session.execute(
        update(EVENTS)
        .where(
            among(EVENTS.c.id, event_ids),
            EVENTS.c.status == EventStatus.IN_PROGRESS,
            EVENTS.c.claimed_by == owner,
        )
        .values(
            status=EventStatus.UNDONE,
            claimed_by=None,
            claimed_until=None,
            attempts=EVENTS.c.attempts - 1,
            updated_at=now,
        )
    )


def finish_events(
    session: Session,
    event_ids: Collection[str],
    at: dt.datetime,
    *,
    taken_by: str | None = None,
    until: dt.datetime | None = None,
) -> None:
    """The events are DONE; ``at`` is when their work finished. With ``taken_by``, the events
    were taken in this same transaction without a claim before (``take_waiting``): the claim's
    columns and the attempt are written here too."""
    if not event_ids:
        return
    values: dict[str, object] = {
        "status": EventStatus.DONE,
        "done_at": at,
        "updated_at": at,
        "last_error": None,
    }
    if taken_by is not None:
        values.update(claimed_by=taken_by, claimed_until=until, attempts=EVENTS.c.attempts + 1)
    session.execute(update(EVENTS).where(among(EVENTS.c.id, event_ids)).values(**values))


def set_lease_status(
    session: Session, lease_ids: Collection[str], status: str | None, at: dt.datetime
) -> None:
    """One statement for many leases: the new ``status`` (None: unchanged) and ``updated_at``."""
    if not lease_ids:
        return
    values: dict[str, object] = {"updated_at": at}
    if status is not None:
        values["status"] = status
    session.execute(update(LEASES).where(among(LEASES.c.id, lease_ids)).values(**values))


def set_reservation_status(
    session: Session, reservation_ids: Collection[str], status: str, at: dt.datetime
) -> None:
    if not reservation_ids:
        return
    session.execute(
        update(RESERVATIONS)
        .where(among(RESERVATIONS.c.id, reservation_ids))
        .values(status=status, updated_at=at)
    )


def leases_for_events(
    session: Session, lease_ids: Collection[str], *, with_events: bool
) -> dict[str, Lease]:
    """The leases with their reservations and allocations, in three queries, replacing any copy
    the session holds. Their events only ``with_events`` (a notification shows them); without,
    touching ``lease.events`` loads them then."""
    if not lease_ids:
        return {}
    options = [selectinload(Lease.reservations).selectinload(Reservation.allocations)]
    if not with_events:
        options.append(lazyload(Lease.events))
    query = (
        select(Lease)
        .where(among(Lease.id, lease_ids))
        .options(*options)
        .execution_options(populate_existing=True)
    )
    return {lease.id: lease for lease in session.scalars(query)}
