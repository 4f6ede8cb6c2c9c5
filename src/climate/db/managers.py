"""Running managers and their heartbeats, where several managers share a database (PostgreSQL).

A manager registers under its unique name before it claims anything, and a thread of its own
beats every ``manager_heartbeat_seconds`` whatever its event loop is doing (a long backend call
included). Once a manager's heartbeat is older than ``manager_dead_seconds`` the others take its
event claims over (``leases.due_events``); until then they never do, however old the claim.
Claims of a manager without a row (one that does not heartbeat) expire at ``claimed_until``.

Heartbeats are the writing host's wall clock, as claims' expiry times are: the hosts' clocks must
agree to well within ``manager_dead_seconds``. Not the service clock, which tests move by hours.
"""

from __future__ import annotations

import datetime as dt
from typing import cast

from sqlalchemy import ColumnElement, Table, delete, func, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import InstrumentedAttribute, Session

from climate.db.tables import Event, ManagerProcess
from climate.db.types import as_utc
from climate.domain.status import EventStatus

MANAGERS = cast(Table, ManagerProcess.__table__)
Holder = ColumnElement[str | None] | InstrumentedAttribute[str | None]
"""A column naming the manager that holds a claim."""


def wall_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def beat(session: Session, name: str, now: dt.datetime) -> None:
    """Record that manager ``name`` is alive at ``now``; registers it if it has no row (its first
    beat, or after a stall so long that another manager pruned it)."""
    updated = session.execute(
        update(MANAGERS).where(MANAGERS.c.name == name).values(heartbeat_at=now)
    )
    if cast(CursorResult[object], updated).rowcount == 0:
        session.execute(insert(MANAGERS).values(name=name, started_at=now, heartbeat_at=now))


def prune(session: Session, dead_before: dt.datetime) -> None:
    """Forget managers silent since before ``dead_before``: by then every claim they made has
    expired too, so nothing needs their heartbeat any more."""
    session.execute(delete(MANAGERS).where(MANAGERS.c.heartbeat_at < dead_before))


def registered(claimed_by: Holder) -> ColumnElement[bool]:
    """The claim's manager heartbeats."""
    return select(MANAGERS.c.name).where(MANAGERS.c.name == claimed_by).exists()


def dead(claimed_by: Holder, alive_since: dt.datetime) -> ColumnElement[bool]:
    """The claim's manager heartbeats, and has not since ``alive_since``."""
    query = select(MANAGERS.c.name).where(
        MANAGERS.c.name == claimed_by, MANAGERS.c.heartbeat_at <= alive_since
    )
    return query.exists()


def oldest_claimer_beat(session: Session) -> dt.datetime | None:
    """The oldest last heartbeat of the managers that hold event claims: its claims become
    takeable ``manager_dead_seconds`` after it, unless it beats again."""
    holders = select(Event.claimed_by).where(Event.status == EventStatus.IN_PROGRESS)
    value = session.scalar(
        select(func.min(MANAGERS.c.heartbeat_at)).where(MANAGERS.c.name.in_(holders))
    )
    return None if value is None else as_utc(value)
