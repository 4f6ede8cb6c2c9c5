"""The standalone backend's records of resources handed to projects."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from climate.db.tables import Assignment


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


def release(session: Session, reservation_id: str, now: dt.datetime) -> int:
    """Mark the reservation's open assignments released; returns how many were still open."""
    open_ones = session.scalars(
        select(Assignment).where(
            Assignment.reservation_id == reservation_id, Assignment.released_at.is_(None)
        )
    ).all()
    for assignment in open_ones:
        assignment.released_at = now
    session.flush()
    return len(open_ones)


def for_lease(session: Session, lease_id: str) -> Sequence[Assignment]:
    return session.scalars(
        select(Assignment).where(Assignment.lease_id == lease_id).order_by(Assignment.resource_id)
    ).all()
