"""The standalone backend's records of resources handed to projects."""

from __future__ import annotations

import datetime as dt
import enum
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, literal, select, true, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from climate.db.leases import string_rows
from climate.db.tables import Assignment, new_id
from climate.db.types import UTCDateTime, among

ASSIGNMENTS = cast(Table, Assignment.__table__)


class State(enum.StrEnum):
    """What the backend did with the project's workload on an assigned resource."""

    RUNNING = "running"
    HELD = "held"
    """A manual start: the project has access, its workload waits to be started."""
    RELEASED = "released"
    DELETED = "deleted"
    SUSPENDED = "suspended"
    SNAPSHOTTED = "snapshotted"
    KEPT = "kept"
    """Ended, the workload kept until the project acknowledges (then ``released``)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One resource handed to a project for a reservation."""

    reservation_id: str
    lease_id: str
    project_id: str
    resource_type: str
    resource_id: str
    at: dt.datetime
    start_policy: str = "auto"
    end_policy: str = "release"
    state: State = State.RUNNING


def assign(
    session: Session,
    *,
    reservation_id: str,
    lease_id: str,
    project_id: str,
    resource_type: str,
    resource_id: str,
    now: dt.datetime,
) -> Assignment:
    """Record the hand-over once: a repeated call returns the existing record (idempotent)."""
    existing = session.scalars(
        select(Assignment).where(
            Assignment.reservation_id == reservation_id,
            Assignment.resource_type == resource_type,
            Assignment.resource_id == resource_id,
        )
    ).first()
    if existing is not None:
        return existing
    assignment = Assignment(
        reservation_id=reservation_id,
        lease_id=lease_id,
        project_id=project_id,
        resource_type=resource_type,
        resource_id=resource_id,
        assigned_at=now,
    )
    session.add(assignment)
    session.flush()
    return assignment


def assign_many(session: Session, grants: Sequence[Grant]) -> int:
    """Record many hand-overs, one statement per hand-over time (usually one); those already
    recorded are left as they are (idempotent, like ``assign``). Returns how many were new."""
    if not grants:
        return 0
    session.flush()  # per-row assign() calls of this transaction, if any, are visible below
    by_time: dict[dt.datetime, dict[tuple[str, str, str], tuple[str, ...]]] = defaultdict(dict)
    for g in grants:
        key = (g.reservation_id, g.resource_type, g.resource_id)
        row = (new_id(), *key, g.lease_id, g.project_id, g.start_policy, g.end_policy, g.state)
        by_time[g.at].setdefault(key, row)
    columns = (
        "id",
        "reservation_id",
        "resource_type",
        "resource_id",
        "lease_id",
        "project_id",
        "start_policy",
        "end_policy",
        "state",
    )
    insert_ = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    added = 0
    for at, rows in by_time.items():
        source = select(
            *string_rows(session, list(rows.values()), len(columns)), literal(at, UTCDateTime())
        ).where(true())  # SQLite: an upsert's SELECT needs a WHERE (parsing ambiguity)
        statement = (
            insert_(ASSIGNMENTS)
            .from_select([*columns, "assigned_at"], source)
            .on_conflict_do_nothing(
                index_elements=["reservation_id", "resource_type", "resource_id"]
            )
            .execution_options(preserve_rowcount=True)  # an INSERT's count is not kept otherwise
        )
        added += _count(session.execute(statement))
    return added


def _count(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def release_many(
    session: Session,
    reservation_ids: Collection[str],
    now: dt.datetime,
    *,
    end_policy: str = "release",
    state: State = State.RELEASED,
) -> int:
    """``release`` for many reservations in one statement, recording the end policy applied
    and the workload's ``state``; returns how many were still open."""
    if not reservation_ids:
        return 0
    session.flush()
    result = session.execute(
        update(ASSIGNMENTS)
        .where(
            among(ASSIGNMENTS.c.reservation_id, reservation_ids),
            ASSIGNMENTS.c.released_at.is_(None),
        )
        .values(released_at=now, end_policy=end_policy, state=state)
    )
    return _count(result)


def move_state(session: Session, reservation_id: str, before: State, after: State) -> int:
    """The reservation's assignments in state ``before`` go to ``after``; returns how many."""
    session.flush()
    result = session.execute(
        update(ASSIGNMENTS)
        .where(ASSIGNMENTS.c.reservation_id == reservation_id, ASSIGNMENTS.c.state == before)
        .values(state=after)
    )
    return _count(result)


def release(session: Session, reservation_id: str, now: dt.datetime) -> int:
    """Mark the reservation's open assignments released; returns how many were still open."""
    open_ones = session.scalars(
        select(Assignment).where(
            Assignment.reservation_id == reservation_id, Assignment.released_at.is_(None)
        )
    ).all()
    for assignment in open_ones:
        assignment.released_at = now
        assignment.state = State.RELEASED
    session.flush()
    return len(open_ones)


def for_lease(session: Session, lease_id: str) -> Sequence[Assignment]:
    return session.scalars(
        select(Assignment).where(Assignment.lease_id == lease_id).order_by(Assignment.resource_id)
    ).all()


def release_resource(
    session: Session, reservation_id: str, resource_type: str, resource_id: str, now: dt.datetime
) -> int:
    """Mark one resource of the reservation released (healing took it away), or, for a
    resource id ``"<host>:*"``, every one on that host (an instance reservation's slots);
    idempotent."""
    session.flush()
    host, _, rest = resource_id.partition(":")
    which = (
        ASSIGNMENTS.c.resource_id.like(f"{host}:%")
        if rest == "*"
        else ASSIGNMENTS.c.resource_id == resource_id
    )
    result = session.execute(
        update(ASSIGNMENTS)
        .where(
            ASSIGNMENTS.c.reservation_id == reservation_id,
            ASSIGNMENTS.c.resource_type == resource_type,
            which,
            ASSIGNMENTS.c.released_at.is_(None),
        )
        .values(released_at=now, state=State.RELEASED)
    )
    return _count(result)
