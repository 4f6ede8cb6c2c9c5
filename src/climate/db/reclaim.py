"""Reclaiming hosts for best-effort leases (services/reclaim.py): what the planner reads, and
the moves of instance allocations and of the standalone backend's records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from climate.db.assignments import State
from climate.db.leases import QUEUE_ORDER
from climate.db.tables import (
    Assignment,
    Event,
    HostAllocation,
    InstanceAllocation,
    Lease,
    Reservation,
    new_id,
    table_of,
)
from climate.domain.status import EventStatus, EventType, LeaseStatus, LeaseType

HOST_TYPE = "physical:host"
INSTANCE_TYPE = "virtual:instance"


def hunting(session: Session, now: dt.datetime) -> list[str]:
    """Waiting best-effort leases before their deadline that ask to reclaim hosts, in queue
    order."""
    query = (
        select(Lease.id, Reservation.params)
        .join(Reservation, Reservation.lease_id == Lease.id)
        .where(
            Lease.status == LeaseStatus.IN_PROGRESS,
            Lease.lease_type == LeaseType.BEST_EFFORT,
            Lease.deleted_at.is_(None),
            Lease.deadline > now,
            Reservation.resource_type == HOST_TYPE,
        )
        .order_by(*QUEUE_ORDER)
    )
    found: list[str] = []
    for lease_id, params in session.execute(query):
        if params.get("reclaim") is True and lease_id not in found:
            found.append(lease_id)
    return found


@dataclass(frozen=True, slots=True)
class Holding:
    """An instance allocation with what decides whether it may move."""

    id: str
    reservation_id: str
    lease_id: str
    project_id: str
    lease_status: str
    host_id: int
    count: int
    vcpus: int
    memory_mb: int
    disk_gb: int
    start: dt.datetime
    end: dt.datetime
    params: dict[str, Any]


def holdings(
    session: Session, host_ids: Collection[int], start: dt.datetime, end: dt.datetime
) -> list[Holding]:
    """The instance allocations on ``host_ids`` overlapping [start, end), by host and start."""
    if not host_ids:
        return []
    query = (
        select(
            InstanceAllocation.id,
            InstanceAllocation.reservation_id,
            InstanceAllocation.lease_id,
            Lease.project_id,
            Lease.status,
            InstanceAllocation.host_id,
            InstanceAllocation.count,
            InstanceAllocation.vcpus,
            InstanceAllocation.memory_mb,
            InstanceAllocation.disk_gb,
            InstanceAllocation.start_date,
            InstanceAllocation.end_date,
            Reservation.params,
        )
        .join(Reservation, Reservation.id == InstanceAllocation.reservation_id)
        .join(Lease, Lease.id == InstanceAllocation.lease_id)
        .where(
            InstanceAllocation.host_id.in_(list(host_ids)),
            InstanceAllocation.start_date < end,
            InstanceAllocation.end_date > start,
        )
        .order_by(InstanceAllocation.host_id, InstanceAllocation.start_date, InstanceAllocation.id)
    )
    return [Holding(*cast(tuple[Any, ...], row)) for row in session.execute(query)]


def whole_spans(
    session: Session, host_ids: Collection[int], start: dt.datetime, end: dt.datetime
) -> list[tuple[int, dt.datetime, dt.datetime]]:
    """(host, start, end) of every whole-host allocation of ``host_ids`` overlapping
    [start, end)."""
    if not host_ids:
        return []
    query = select(
        HostAllocation.host_id, HostAllocation.start_date, HostAllocation.end_date
    ).where(
        HostAllocation.host_id.in_(list(host_ids)),
        HostAllocation.start_date < end,
        HostAllocation.end_date > start,
    )
    return [(h, s, e) for h, s, e in session.execute(query)]


def hold_starts(session: Session, lease_ids: Collection[str]) -> set[str]:
    """Those of ``lease_ids`` whose start event waits, locked until this transaction ends
    (``SKIP LOCKED``: a start a manager holds now is not waited for, and its lease is left
    where it is). As late binding does (db/repacking.py): a pending lease is moved only while no
    manager can start it from the hosts it had."""
    if not lease_ids:
        return set()
    query = (
        select(Event.lease_id)
        .where(
            Event.lease_id.in_(sorted(lease_ids)),
            Event.event_type == EventType.START_LEASE,
            Event.status == EventStatus.UNDONE,
        )
        .with_for_update(skip_locked=True)
    )
    return set(session.scalars(query))


def move_allocation(session: Session, allocation_id: str, to_host: int, at: dt.datetime) -> None:
    """Move an instance allocation to ``to_host`` from ``at`` on: the part before ``at`` stays
    where it ran (its row is cut at ``at``), the rest becomes a row on ``to_host``."""
    row = session.get(InstanceAllocation, allocation_id)
    if row is None:
        raise LookupError(f"instance allocation {allocation_id} is gone")
    if row.start_date >= at:
        row.host_id = to_host
        session.flush()
        return
    moved = {
        "id": new_id(),
        "reservation_id": row.reservation_id,
        "lease_id": row.lease_id,
        "host_id": to_host,
        "count": row.count,
        "vcpus": row.vcpus,
        "memory_mb": row.memory_mb,
        "disk_gb": row.disk_gb,
        "start_date": at,
        "end_date": row.end_date,
    }
    row.end_date = at
    session.flush()
    session.execute(insert(table_of(InstanceAllocation)), [moved])


def reassign(
    session: Session,
    reservation_id: str,
    from_host: int,
    to_host: int,
    count: int,
    at: dt.datetime,
) -> int:
    """The standalone backend's record of a migration: up to ``count`` open instance slots of
    the reservation on ``from_host`` (``"<host>:<n>"``) are released at ``at`` and as many new
    slots on ``to_host`` are assigned from ``at``. Returns how many moved; a repeated call finds
    nothing left to move."""
    slots = list(
        session.scalars(
            select(Assignment)
            .where(
                Assignment.reservation_id == reservation_id,
                Assignment.resource_type == INSTANCE_TYPE,
                Assignment.resource_id.like(f"{from_host}:%"),
                Assignment.released_at.is_(None),
            )
            .order_by(Assignment.resource_id)
            .limit(count)
        )
    )
    if not slots:
        return 0
    taken = session.scalars(
        select(Assignment.resource_id).where(
            Assignment.reservation_id == reservation_id,
            Assignment.resource_type == INSTANCE_TYPE,
            Assignment.resource_id.like(f"{to_host}:%"),
        )
    )
    numbers = {int(r.partition(":")[2]) for r in taken}
    free = (n for n in range(len(numbers) + len(slots)) if n not in numbers)
    columns = [c.key for c in table_of(Assignment).columns]
    moved = []
    for slot, n in zip(slots, free, strict=False):
        # The workload goes on as it was (its policies and state), in a new slot on the new host.
        row = {key: getattr(slot, key) for key in columns}
        row.update(id=new_id(), resource_id=f"{to_host}:{n}", assigned_at=at, released_at=None)
        moved.append(row)
    session.execute(
        update(Assignment)
        .where(Assignment.id.in_([s.id for s in slots]))
        .values(released_at=at, state=State.RELEASED)  # the host is vacated, not the workload
    )
    session.execute(insert(table_of(Assignment)), moved)
    return len(slots)
