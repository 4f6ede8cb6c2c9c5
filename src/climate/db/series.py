"""Lease series rows, and the leases made for them (their occurrences)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from climate.db.tables import Lease, LeaseSeries, table_of
from climate.domain.status import LeaseStatus

_ADD_SERIES = insert(table_of(LeaseSeries))


def insert_new(session: Session, series: LeaseSeries) -> None:
    """Write a new series built outside the session (every column set), as it stands."""
    columns = table_of(LeaseSeries).columns
    session.execute(_ADD_SERIES, [{c.key: getattr(series, c.key) for c in columns}])


def get(session: Session, series_id: str, *, project_id: str | None = None) -> LeaseSeries | None:
    """A live (not deleted) series; with ``project_id``, only if it belongs to that project."""
    query = select(LeaseSeries).where(LeaseSeries.id == series_id, LeaseSeries.deleted_at.is_(None))
    if project_id is not None:
        query = query.where(LeaseSeries.project_id == project_id)
    return session.scalars(query).first()


def list_live(
    session: Session, *, project_id: str | None = None, limit: int | None = None
) -> Sequence[LeaseSeries]:
    """Live series, oldest first."""
    query = select(LeaseSeries).where(LeaseSeries.deleted_at.is_(None))
    if project_id is not None:
        query = query.where(LeaseSeries.project_id == project_id)
    query = query.order_by(LeaseSeries.created_at, LeaseSeries.id)
    return session.scalars(query.limit(limit)).all()


def name_taken(session: Session, project_id: str, name: str) -> bool:
    query = select(LeaseSeries.id).where(
        LeaseSeries.project_id == project_id,
        LeaseSeries.name == name,
        LeaseSeries.deleted_at.is_(None),
    )
    return session.execute(query.limit(1)).first() is not None


def occurrences(session: Session, series_id: str) -> list[Lease]:
    """Every lease made for the series, deleted ones included, in occurrence order."""
    query = select(Lease).where(Lease.series_id == series_id)
    return list(session.scalars(query.order_by(Lease.occurrence, Lease.id)))


def cancellable(session: Session, series_id: str, now: dt.datetime) -> list[str]:
    """The series' live leases that have not ended, in occurrence order."""
    query = select(Lease.id).where(
        Lease.series_id == series_id,
        Lease.deleted_at.is_(None),
        Lease.status != LeaseStatus.TERMINATED,
        Lease.end_date > now,
    )
    return list(session.scalars(query.order_by(Lease.occurrence, Lease.id)))
