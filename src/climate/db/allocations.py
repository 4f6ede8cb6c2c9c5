"""What every allocation table shares: the filters of the allocation endpoints."""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVarTuple

from sqlalchemy import Select

from climate.db.tables import Lease

_Row = TypeVarTuple("_Row")


def narrowed(
    query: Select[*_Row],
    model: Any,
    *,
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> Select[*_Row]:
    """``query`` (joined with ``leases``) kept to the allocations of that lease, reservation or
    project that overlap [start, end), as far as each is given. ``model`` is an allocation
    table's model: ``lease_id``, ``reservation_id``, ``start_date``, ``end_date``."""
    if lease_id is not None:
        query = query.where(model.lease_id == lease_id)
    if reservation_id is not None:
        query = query.where(model.reservation_id == reservation_id)
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    if start is not None:
        query = query.where(model.end_date > start)
    if end is not None:
        query = query.where(model.start_date < end)
    return query
