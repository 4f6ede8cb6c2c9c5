"""Idle reclamation's records (services/idle.py): the running leases it watches, when each was
last seen in use, when it was last warned."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from climate.db.records import LeaseIdle
from climate.db.tables import Lease, Reservation, table_of
from climate.domain.status import LeaseStatus


def watched(
    session: Session, resource_types: Collection[str], exempt_projects: Collection[str]
) -> Sequence[tuple[Lease, LeaseIdle | None]]:
    """Every running (ACTIVE, live) lease with a reservation of one of ``resource_types``,
    outside ``exempt_projects`` and not exempted itself, with its record (None: never seen in
    use, warned nor exempted)."""
    query = (
        select(Lease, LeaseIdle)
        .outerjoin(LeaseIdle, LeaseIdle.lease_id == Lease.id)
        .where(
            Lease.status == LeaseStatus.ACTIVE,
            Lease.deleted_at.is_(None),
            Lease.reservations.any(Reservation.resource_type.in_(list(resource_types))),
            or_(LeaseIdle.lease_id.is_(None), LeaseIdle.exempt.is_(False)),
        )
        .order_by(Lease.start_date, Lease.id)
    )
    if exempt_projects:
        query = query.where(Lease.project_id.not_in(list(exempt_projects)))
    return [(lease, record) for lease, record in session.execute(query)]


def record_of(session: Session, lease_id: str) -> LeaseIdle | None:
    return session.get(LeaseIdle, lease_id, populate_existing=True)


def _ensure(session: Session, lease_id: str) -> None:
    """The lease's row, made if missing (a heartbeat and the manager may race to make it)."""
    insert_ = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert_(table_of(LeaseIdle)).values(lease_id=lease_id)
    session.execute(statement.on_conflict_do_nothing(index_elements=["lease_id"]))


def used(session: Session, lease_id: str, at: dt.datetime) -> None:
    """The lease was seen in use at ``at`` (a later sign already recorded stands)."""
    _ensure(session, lease_id)
    session.execute(
        update(LeaseIdle)
        .where(
            LeaseIdle.lease_id == lease_id,
            or_(LeaseIdle.last_used_at.is_(None), LeaseIdle.last_used_at < at),
        )
        .values(last_used_at=at)
    )


def warned(session: Session, lease_id: str, at: dt.datetime) -> None:
    _ensure(session, lease_id)
    session.execute(update(LeaseIdle).where(LeaseIdle.lease_id == lease_id).values(warned_at=at))


def exempt(session: Session, lease_id: str, exempted: bool) -> None:
    _ensure(session, lease_id)
    session.execute(update(LeaseIdle).where(LeaseIdle.lease_id == lease_id).values(exempt=exempted))
