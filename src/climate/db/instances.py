"""Instance allocations: what instance reservations use of each host, and when."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVarTuple

from sqlalchemy import Select, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from climate.db import allocation_listing, raw
from climate.db import allocations as allocation_rows
from climate.db.allocations import narrowed
from climate.db.tables import (
    InstanceAllocation,
    Lease,
    Reservation,
    built,
    new_id,
    table_of,
)
from climate.db.types import as_utc, in_listed, iso_text
from climate.planner.calendar import seconds
from climate.planner.instance_uses import HostUse

_Row = TypeVarTuple("_Row")
RESOURCE_TYPE = "virtual:instance"
OWNER_PREFIX = "instances:"
"""Owner of a host's instance usage in the whole-host calendar (see ``usage_spans``)."""


def usage_owner(host_id: int) -> str:
    return f"{OWNER_PREFIX}{host_id}"


def host_of_owner(owner: str) -> int | None:
    """The host whose instance usage ``owner`` stands for; None for a real reservation."""
    return int(owner[len(OWNER_PREFIX) :]) if owner.startswith(OWNER_PREFIX) else None


_USE_COLUMNS = (
    InstanceAllocation.host_id,
    InstanceAllocation.start_date,
    InstanceAllocation.end_date,
    InstanceAllocation.vcpus,
    InstanceAllocation.memory_mb,
    InstanceAllocation.disk_gb,
    InstanceAllocation.reservation_id,
)
# Built once (run below the ORM by ``raw.rows``): the hosts' calendar reloads hosts' uses as
# admissions change them.
_USES_SINCE = select(*_USE_COLUMNS).where(InstanceAllocation.end_date > bindparam("since"))
_USES_OF_HOSTS = _USES_SINCE.where(in_listed(InstanceAllocation.host_id, "hosts"))


def uses_of(session: Session, host_ids: Collection[int], since: dt.datetime) -> list[HostUse]:
    """The instance allocations of ``host_ids`` ending after ``since``, for the hosts'
    calendar."""
    return _uses(raw.rows(session, _USES_OF_HOSTS, {"hosts": list(host_ids), "since": since}))


def uses_since(session: Session, since: dt.datetime) -> list[HostUse]:
    """Every instance allocation ending after ``since``, for the hosts' calendar."""
    return _uses(raw.rows(session, _USES_SINCE, {"since": since}))


def _uses(rows: Iterable[Any]) -> list[HostUse]:
    return [
        HostUse(h, seconds(as_utc(s)), seconds(as_utc(e)), v, m, d, r)
        for h, s, e, v, m, d, r in rows
    ]


def hosts_of(session: Session, reservation_id: str) -> set[int]:
    rows = session.execute(
        select(InstanceAllocation.host_id).where(
            InstanceAllocation.reservation_id == reservation_id
        )
    )
    return {row[0] for row in rows}


def replace(
    session: Session,
    reservation_id: str,
    lease_id: str,
    placement: Mapping[int, int],
    size: tuple[int, int, int],
    start: dt.datetime,
    end: dt.datetime,
    *,
    since: dt.datetime | None = None,
) -> list[InstanceAllocation]:
    """Give the reservation ``placement`` (instances per host) of ``size`` each over
    [start, end), and nothing else; returns its rows as objects outside the session.

    ``since``: the reservation runs and is changed at ``since``. Its rows that ended by then
    (where instances ran before healing or a reclaim moved them) stay, the instances it holds
    keep their rows' starts (to ``end`` now), and those it gains are held from ``since``."""
    row = InstanceAllocation
    mine = row.reservation_id == reservation_id
    held: dict[int, int] = {}
    if since is None:
        session.execute(delete(row).where(mine))
    else:
        running = mine & (row.end_date > since)
        for host_id, count in session.execute(select(row.host_id, row.count).where(running)):
            held[host_id] = held.get(host_id, 0) + count
        gone = [h for h in held if placement.get(h, 0) < held[h]]
        if gone:  # a running reservation never shrinks: only in case, they end now
            session.execute(
                update(row).where(running, row.host_id.in_(gone)).values(end_date=since)
            )
            held = {h: c for h, c in held.items() if h not in gone}
        session.execute(update(row).where(running).values(end_date=end))
    vcpus, memory_mb, disk_gb = size
    rows = [
        {
            "id": new_id(),
            "reservation_id": reservation_id,
            "lease_id": lease_id,
            "host_id": host_id,
            "count": count - held.get(host_id, 0),
            "vcpus": vcpus * (count - held.get(host_id, 0)),
            "memory_mb": memory_mb * (count - held.get(host_id, 0)),
            "disk_gb": disk_gb * (count - held.get(host_id, 0)),
            "start_date": start if since is None else max(start, since),
            "end_date": end,
        }
        for host_id, count in sorted(placement.items())
        if count > held.get(host_id, 0)
    ]
    table = table_of(InstanceAllocation)
    if rows:
        session.execute(insert(table), rows)
    if since is None:
        return [built(InstanceAllocation, **r) for r in rows]
    written = session.execute(select(table).where(table.c.reservation_id == reservation_id))
    return [built(InstanceAllocation, **r) for r in written.mappings()]


def truncate(session: Session, reservation_id: str, at: dt.datetime) -> None:
    """End the reservation's allocations at ``at`` (drop those that had not begun)."""
    allocation_rows.truncate(session, InstanceAllocation, reservation_id, at)


def leases_holding(session: Session, host_id: int, since: dt.datetime) -> list[str]:
    return allocation_rows.leases_holding(session, InstanceAllocation.host_id, host_id, since)


def params_holding(session: Session, host_id: int, since: dt.datetime) -> list[dict[str, Any]]:
    """The parameters of the instance reservations with a slot on ``host_id`` after ``since``."""
    return allocation_rows.params_holding(session, InstanceAllocation.host_id, host_id, since)


def remove_for_host(session: Session, host_id: int) -> None:
    """Forget a deleted host's (past) instance allocations."""
    session.execute(delete(InstanceAllocation).where(InstanceAllocation.host_id == host_id))


@dataclass(slots=True)
class AllocationRow:
    """An instance reservation's allocation on a host, as its listing shows it (not a
    ``NamedTuple``: its ``count`` would hide the tuple's)."""

    host_id: int
    reservation_id: str
    lease_id: str
    count: int
    start_date: str
    """Naive UTC ISO text, Blazar's lease date (``types.iso_text``)."""
    end_date: str


def _live(query: Select[*_Row], **filters: Any) -> Select[*_Row]:
    """``query`` over instance allocations kept to live leases and narrowed by ``filters``."""
    query = query.join(Lease, Lease.id == InstanceAllocation.lease_id).where(
        Lease.deleted_at.is_(None)
    )
    return narrowed(query, InstanceAllocation, **filters)


def allocated_hosts(
    session: Session,
    *,
    after: int | None = None,
    limit: int,
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> list[int]:
    """A page of the hosts (by id, after ``after``) with instance allocations of live leases
    overlapping [start, end), filtered as asked."""
    query = select(InstanceAllocation.host_id).distinct().order_by(InstanceAllocation.host_id)
    if after is not None:
        query = query.where(InstanceAllocation.host_id > after)
    query = _live(
        query,
        lease_id=lease_id,
        reservation_id=reservation_id,
        project_id=project_id,
        start=start,
        end=end,
    )
    return list(session.scalars(query.limit(limit)))


def allocations(
    session: Session,
    *,
    host_ids: Collection[int],
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> list[AllocationRow]:
    """Instance allocations on ``host_ids`` of live leases overlapping [start, end), filtered
    as asked, by host then start."""
    query = (
        select(
            InstanceAllocation.host_id,
            InstanceAllocation.reservation_id,
            InstanceAllocation.lease_id,
            InstanceAllocation.count,
            iso_text(InstanceAllocation.start_date),
            iso_text(InstanceAllocation.end_date),
        )
        .where(InstanceAllocation.host_id.in_(list(host_ids)))
        .order_by(
            InstanceAllocation.host_id,
            InstanceAllocation.start_date,
            InstanceAllocation.reservation_id,
        )
    )
    query = _live(
        query,
        lease_id=lease_id,
        reservation_id=reservation_id,
        project_id=project_id,
        start=start,
        end=end,
    )
    return [AllocationRow(*row) for row in session.connection().execute(query).all()]


@dataclass(frozen=True, slots=True)
class ListedRow:
    """An instance allocation of a live lease as ``allocation_listing`` keeps it: an
    ``AllocationRow`` with the lease's project."""

    host_id: int
    reservation_id: str
    lease_id: str
    project_id: str
    count: int
    start_date: str
    end_date: str


listed_allocations = allocation_listing.loader(
    InstanceAllocation, lambda row: ListedRow(*row), InstanceAllocation.count
)
"""The instance allocations of live leases that end after a time (all of them, or those of
these reservations or on these hosts), with each lease's project."""


@dataclass(frozen=True, slots=True)
class Suffering:
    """An instance allocation of a live lease on a failed host, still to come or under way."""

    allocation_id: str
    host_id: int
    reservation_id: str
    lease_id: str
    count: int
    start: dt.datetime
    end: dt.datetime


def suffering(
    session: Session, host_ids: Collection[int], now: dt.datetime, until: dt.datetime | None
) -> list[Suffering]:
    """Instance allocations of live leases on ``host_ids`` that end after ``now`` and begin
    before ``until`` (None: any time), earliest first."""
    if not host_ids:
        return []
    query = _live(
        select(
            InstanceAllocation.id,
            InstanceAllocation.host_id,
            InstanceAllocation.reservation_id,
            InstanceAllocation.lease_id,
            InstanceAllocation.count,
            InstanceAllocation.start_date,
            InstanceAllocation.end_date,
        ).where(
            InstanceAllocation.host_id.in_(list(host_ids)),
            InstanceAllocation.end_date > now,
        )
    ).order_by(
        InstanceAllocation.start_date, InstanceAllocation.reservation_id, InstanceAllocation.host_id
    )
    if until is not None:
        query = query.where(InstanceAllocation.start_date < until)
    return [Suffering(*row) for row in session.execute(query)]


def lacking(session: Session, now: dt.datetime) -> list[Reservation]:
    """Instance reservations of live leases, not over by ``now``, that lack instances healing
    could not place; those starting first first."""
    return list(
        session.scalars(
            select(Reservation)
            .join(Lease, Lease.id == Reservation.lease_id)
            .where(
                Reservation.missing_resources.is_(True),
                Reservation.resource_type == RESOURCE_TYPE,
                Lease.deleted_at.is_(None),
                Lease.end_date > now,
            )
            .order_by(Lease.start_date, Reservation.id)
        )
    )


def cut(session: Session, allocation_id: str, at: dt.datetime) -> None:
    """The allocation leaves its host from ``at`` on (all of it, if it had not begun): the past
    stays where it ran."""
    table = table_of(InstanceAllocation)
    session.execute(delete(table).where(table.c.id == allocation_id, table.c.start_date >= at))
    session.execute(
        update(table)
        .where(table.c.id == allocation_id, table.c.start_date < at)
        .values(end_date=at)
    )


def add(
    session: Session,
    reservation_id: str,
    lease_id: str,
    counts: Mapping[int, int],
    size: tuple[int, int, int],
    start: dt.datetime,
    end: dt.datetime,
) -> None:
    """``counts`` instances per host of ``size`` each over [start, end), beside what the
    reservation has."""
    vcpus, memory_mb, disk_gb = size
    rows = [
        {
            "id": new_id(),
            "reservation_id": reservation_id,
            "lease_id": lease_id,
            "host_id": host_id,
            "count": count,
            "vcpus": vcpus * count,
            "memory_mb": memory_mb * count,
            "disk_gb": disk_gb * count,
            "start_date": start,
            "end_date": end,
        }
        for host_id, count in sorted(counts.items())
        if count > 0
    ]
    if rows:
        session.execute(insert(table_of(InstanceAllocation)), rows)
