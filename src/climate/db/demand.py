"""Refused demand (``refused_demand``): written after a refusal's own transaction rolled back,
read by ``GET /v1/demand`` with the leases that may have taken a counter-offer."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session

from climate.db import raw
from climate.db.records import RefusedDemand
from climate.db.tables import Lease, table_of

_ADD = insert(table_of(RefusedDemand))
_COLUMNS = [c.name for c in table_of(RefusedDemand).columns if c.name != "id"]


def add(session: Session, rows: Iterable[RefusedDemand]) -> None:
    """Insert ``rows`` (built outside the session) in one statement, below the ORM: it is
    part of every refusal's answer."""
    raw.write(session, _ADD, [{name: getattr(row, name) for name in _COLUMNS} for row in rows])


def overlapping(
    session: Session, start: dt.datetime, end: dt.datetime, project_id: str | None
) -> list[RefusedDemand]:
    """Refused demand whose asked window overlaps [start, end), of ``project_id`` (None: all),
    in the order it was refused."""
    query = select(RefusedDemand).where(
        RefusedDemand.start_date < end, RefusedDemand.end_date > start
    )
    if project_id is not None:
        query = query.where(RefusedDemand.project_id == project_id)
    return list(session.scalars(query.order_by(RefusedDemand.at, RefusedDemand.id)))


def made_or_changed(
    session: Session, projects: Collection[str], start: dt.datetime, end: dt.datetime
) -> list[tuple[str, str, dt.datetime, dt.datetime, dt.datetime, dt.datetime | None]]:
    """Leases of ``projects`` created or changed in [start, end], dry runs never being
    written: (id, project, start, end, created_at, updated_at)."""
    if not projects:
        return []
    rows = session.execute(
        select(
            Lease.id,
            Lease.project_id,
            Lease.start_date,
            Lease.end_date,
            Lease.created_at,
            Lease.updated_at,
        ).where(
            Lease.project_id.in_(projects),
            or_(
                Lease.created_at.between(start, end),
                Lease.updated_at.between(start, end),
            ),
        )
    )
    return [tuple(row) for row in rows]  # type: ignore[misc]
