"""Host power records (services/power.py): which hosts are powered down, since when, and what
keeps the others busy."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from climate.db.hosts import DOWN
from climate.db.records import HostPower
from climate.db.tables import Host, HostAllocation, InstanceAllocation, Lease


@dataclass(frozen=True, slots=True)
class PowerHost:
    id: int
    name: str
    """Nova's service host (its hypervisor hostname when it has none)."""
    down: bool
    """Failed (host health): the power policy leaves it alone."""
    off_since: dt.datetime | None
    """When the power policy powered it down; None: it is on."""


def hosts(session: Session) -> list[PowerHost]:
    """Every host with its power state, in id order."""
    off = select(HostPower.host_id, HostPower.off_at).where(HostPower.on_at.is_(None)).subquery()
    rows = session.execute(
        select(Host.id, Host.service_name, Host.hypervisor_hostname, Host.health, off.c.off_at)
        .outerjoin(off, off.c.host_id == Host.id)
        .order_by(Host.id)
    )
    return [
        PowerHost(host_id, service or name, health == DOWN, off_at)
        for host_id, service, name, health, off_at in rows
    ]


def next_busy(
    session: Session, now: dt.datetime, until: dt.datetime, host_ids: list[int] | None = None
) -> dict[int, dt.datetime]:
    """Per host with an allocation of a live lease ending after ``now`` and starting before
    ``until`` (whole host or instances on it): when its earliest such allocation starts."""
    busy: dict[int, dt.datetime] = {}
    for model in (HostAllocation, InstanceAllocation):
        query = (
            select(model.host_id, func.min(model.start_date))
            .join(Lease, Lease.id == model.lease_id)
            .where(Lease.deleted_at.is_(None), model.end_date > now, model.start_date < until)
            .group_by(model.host_id)
        )
        if host_ids is not None:
            query = query.where(model.host_id.in_(host_ids))
        for host_id, start in session.execute(query):
            busy[host_id] = min(start, busy.get(host_id, start))
    return busy


def off_among(session: Session, host_ids: list[int]) -> list[int]:
    """Those of ``host_ids`` powered down now, in id order."""
    if not host_ids:
        return []
    query = (
        select(HostPower.host_id)
        .where(HostPower.on_at.is_(None), HostPower.host_id.in_(host_ids))
        .order_by(HostPower.host_id)
    )
    return list(session.scalars(query))


def powered_off(session: Session, host_id: int, at: dt.datetime) -> None:
    session.add(HostPower(host_id=host_id, off_at=at))
    session.flush()


def powered_on(session: Session, host_id: int, at: dt.datetime) -> None:
    session.execute(
        update(HostPower)
        .where(HostPower.host_id == host_id, HostPower.on_at.is_(None))
        .values(on_at=at)
    )


def off_periods(
    session: Session, start: dt.datetime, end: dt.datetime
) -> list[tuple[int, dt.datetime, dt.datetime | None]]:
    """(host, off_at, on_at) of every powered-down period overlapping [start, end)."""
    rows = session.execute(
        select(HostPower.host_id, HostPower.off_at, HostPower.on_at)
        .where(HostPower.off_at < end, (HostPower.on_at.is_(None)) | (HostPower.on_at > start))
        .order_by(HostPower.host_id, HostPower.off_at)
    )
    return [(host_id, off_at, on_at) for host_id, off_at, on_at in rows]
