"""Host inventory and host allocation queries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Select, delete, insert, select, update
from sqlalchemy.orm import Session

from climate.db import allocation_listing, raw
from climate.db import allocations as allocation_rows
from climate.db.allocations import narrowed
from climate.db.engine import INVENTORY_VERSION
from climate.db.leases import after_marker, keyset_order
from climate.db.tables import (
    Host,
    HostAllocation,
    HostProperty,
    Lease,
    Lock,
    Reservation,
    ResourceProperty,
    new_id,
    table_of,
)
from climate.db.types import iso_text
from climate.planner.instance_uses import HostUse

RESOURCE_TYPE = "physical:host"

HOST_COLUMNS = (
    "hypervisor_hostname",
    "service_name",
    "hypervisor_type",
    "hypervisor_version",
    "vcpus",
    "memory_mb",
    "local_gb",
    "cpu_info",
)
"""The host columns a ``HostRecord`` carries among its properties."""

# How far around a window we look for neighbouring allocations when scoring fit: a gap longer
# than this counts as open. Short, so that the scans stay small as the calendar fills.
LOOKAROUND = dt.timedelta(days=1)


def get(session: Session, host_id: int) -> Host | None:
    return session.get(Host, host_id)


def display_name(session: Session, host_id: int) -> str:
    """The host's hypervisor hostname (its id when it is gone)."""
    host = session.get(Host, host_id)
    return host.hypervisor_hostname if host is not None else str(host_id)


def service_name(session: Session, host_id: int) -> str:
    """The name its compute service goes by (its hostname, or its id when it is gone)."""
    host = session.get(Host, host_id)
    if host is None:
        return str(host_id)
    return host.service_name or host.hypervisor_hostname


def get_by_name(session: Session, name: str) -> Host | None:
    return session.scalars(select(Host).where(Host.hypervisor_hostname == name)).first()


HOST_SORT_KEYS = ("id", "hypervisor_hostname", "created_at")


def list_all(
    session: Session,
    *,
    limit: int | None = None,
    marker: Host | None = None,
    sort_key: str = "id",
    descending: bool = False,
) -> Sequence[Host]:
    """Hosts in (``sort_key``, id) order, the ``limit`` after ``marker`` if given."""
    return session.scalars(_page(select(Host), limit, marker, sort_key, descending)).all()


def ids(
    session: Session,
    *,
    limit: int | None = None,
    marker: Host | None = None,
    sort_key: str = "id",
    descending: bool = False,
) -> list[int]:
    """``list_all``'s hosts, their ids alone (no host loaded)."""
    return list(session.scalars(_page(select(Host.id), limit, marker, sort_key, descending)))


def _page(
    query: Select[Any], limit: int | None, marker: Host | None, sort_key: str, descending: bool
) -> Select[Any]:
    column = getattr(Host, sort_key)
    query = query.order_by(*keyset_order(column, Host.id, descending))
    if marker is not None:
        query = query.where(
            after_marker(column, Host.id, getattr(marker, sort_key), marker.id, descending)
        )
    return query.limit(limit)


def add(session: Session, host: Host) -> Host:
    session.add(host)
    session.flush()
    return host


def set_properties(session: Session, host: Host, changes: dict[str, str | None]) -> None:
    """Set (or, for None, remove) extra properties of ``host``."""
    current = {p.name: p for p in host.properties}
    for name, value in changes.items():
        if value is None:
            if name in current:
                host.properties.remove(current[name])
        elif name in current:
            current[name].value = value
        else:
            host.properties.append(HostProperty(name=name, value=value))
    session.flush()


def remove(session: Session, host: Host, version: int) -> None:
    """Delete ``host`` with its (past) allocations, logging them for in-memory calendars."""
    allocation_rows.remove(session, host, HostAllocation.host_id, version)


def leases_holding(session: Session, host_id: int, since: dt.datetime) -> list[str]:
    """Ids of the leases with an allocation of ``host_id`` that ends after ``since``."""
    return allocation_rows.leases_holding(session, HostAllocation.host_id, host_id, since)


def params_holding(session: Session, host_id: int, since: dt.datetime) -> list[dict[str, Any]]:
    """The parameters of the whole-host reservations holding ``host_id`` after ``since``."""
    return allocation_rows.params_holding(session, HostAllocation.host_id, host_id, since)


@dataclass(frozen=True, slots=True)
class HostRecord:
    """A reservable host as the planner sees it: id, name and every queryable property."""

    id: int
    hypervisor_hostname: str
    properties: dict[str, str | int | None]


def bump_inventory(session: Session) -> None:
    session.execute(
        update(Lock).where(Lock.name == INVENTORY_VERSION).values(version=Lock.version + 1)
    )
    session.info.pop(_VERSION_READ, None)


_LOCKS = table_of(Lock).c
_INVENTORY_VERSION = select(_LOCKS.version).where(_LOCKS.name == INVENTORY_VERSION)
_VERSION_READ = "inventory_version"


def inventory_version(session: Session) -> int:
    """The inventory version, read once per transaction (a session is one transaction) unless
    it bumps it: an admission with usage rules asks twice, for the hosts and for their facts."""
    known: int | None = session.info.get(_VERSION_READ)
    if known is None:
        found = raw.rows(session, _INVENTORY_VERSION, {})
        known = session.info[_VERSION_READ] = int(found[0][0] or 0) if found else 0
    return known


UP = "up"
DOWN = "down"
_USABLE = Host.reservable.is_(True) & (Host.health == UP)
"""Reservable by the admin and not down."""


def reservable_records(session: Session, columns: Sequence[str]) -> list[HostRecord]:
    """Every reservable host (not down) with ``columns`` and its extra properties: two
    queries, no ORM."""
    wanted = [getattr(Host, c) for c in columns]
    rows = session.execute(select(Host.id, *wanted).where(_USABLE).order_by(Host.id)).all()
    records = {
        row[0]: HostRecord(
            row[0],
            row[1 + columns.index("hypervisor_hostname")],
            dict(zip(columns, row[1:], strict=True)),
        )
        for row in rows
    }
    extras = session.execute(
        select(HostProperty.host_id, HostProperty.name, HostProperty.value)
        .join(Host, Host.id == HostProperty.host_id)
        .where(_USABLE)
    )
    for host_id, name, value in extras:
        records[host_id].properties[name] = value
    return list(records.values())


def replace_allocations(
    session: Session,
    reservation_id: str,
    lease_id: str,
    host_ids: Iterable[int],
    start: dt.datetime,
    end: dt.datetime,
    *,
    fresh: bool = False,
    since: dt.datetime | None = None,
    starts: Mapping[int, dt.datetime] | None = None,
) -> list[HostAllocation]:
    """Give the reservation exactly ``host_ids`` over [start, end) (``fresh``: it holds none
    yet; ``since``: it runs, see ``db.allocations.replace``); returns its rows as objects
    outside the session."""
    return allocation_rows.replace(
        session,
        HostAllocation.host_id,
        reservation_id,
        lease_id,
        host_ids,
        start,
        end,
        fresh=fresh,
        since=since,
        starts=starts,
    )


def truncate_allocations(session: Session, reservation_id: str, at: dt.datetime) -> None:
    """End the reservation's allocations at ``at`` (drop those that had not begun)."""
    allocation_rows.truncate(session, HostAllocation, reservation_id, at)


class AllocationRow(NamedTuple):
    """One reservation's allocation of a resource, as the allocation listings show it (a
    tuple: a listing makes thousands)."""

    host_id: int
    reservation_id: str
    lease_id: str
    start_date: str
    """Naive UTC ISO text, Blazar's lease date (``types.iso_text``)."""
    end_date: str


def allocations(
    session: Session,
    *,
    host_range: tuple[int, int] | None = None,
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> list[AllocationRow]:
    """Allocations of live leases overlapping [start, end), filtered as asked, in one query."""
    query = (
        select(
            HostAllocation.host_id,
            HostAllocation.reservation_id,
            HostAllocation.lease_id,
            iso_text(HostAllocation.start_date),
            iso_text(HostAllocation.end_date),
        )
        .join(Lease, Lease.id == HostAllocation.lease_id)
        .where(Lease.deleted_at.is_(None))
        .order_by(HostAllocation.host_id, HostAllocation.start_date, HostAllocation.reservation_id)
    )
    if host_range is not None:
        query = query.where(HostAllocation.host_id.between(*host_range))
    query = narrowed(
        query,
        HostAllocation,
        lease_id=lease_id,
        reservation_id=reservation_id,
        project_id=project_id,
        start=start,
        end=end,
    )
    return list(map(AllocationRow._make, session.connection().execute(query).all()))


class ListedRow(NamedTuple):
    """An allocation of a live lease as ``allocation_listing`` keeps it: an ``AllocationRow``
    with the lease's project."""

    host_id: int
    reservation_id: str
    lease_id: str
    project_id: str
    start_date: str
    end_date: str


listed_allocations = allocation_listing.loader(HostAllocation, ListedRow._make)
"""The allocations of live leases that end after a time (all of them, or those of these
reservations or on these hosts), with each lease's project."""


def property_settings(session: Session) -> dict[str, ResourceProperty]:
    rows = session.scalars(
        select(ResourceProperty).where(ResourceProperty.resource_type == RESOURCE_TYPE)
    )
    return {r.property_name: r for r in rows}


def property_values(session: Session) -> dict[str, list[str]]:
    """Every extra property name in use, with its distinct values."""
    values: dict[str, list[str]] = {}
    for name, value in session.execute(
        select(HostProperty.name, HostProperty.value)
        .distinct()
        .order_by(HostProperty.name, HostProperty.value)
    ):
        values.setdefault(name, []).append(value)
    return values


def upsert_property_setting(
    session: Session, name: str, private: bool, now: dt.datetime
) -> ResourceProperty:
    setting = property_settings(session).get(name)
    if setting is None:
        setting = ResourceProperty(
            resource_type=RESOURCE_TYPE, property_name=name, private=private, created_at=now
        )
        session.add(setting)
    else:
        setting.private = private
        setting.updated_at = now
    session.flush()
    return setting


@dataclass(frozen=True, slots=True)
class SpanRow:
    host_id: int
    start: dt.datetime
    end: dt.datetime
    reservation_id: str
    lease_id: str = ""
    """Empty for a span of no lease (a host's instance usage)."""


@dataclass
class Loaded:
    """Allocations as an ``AllocationStore`` reads them for its calendar
    (``db/calendar_cache.py``)."""

    spans: list[SpanRow]
    uses: dict[int, list[HostUse]] | None = None
    """The hosts' calendar only: the instance uses of each host read, in full (a host that has
    none now maps to an empty list)."""


_SPAN_COLUMNS = (
    HostAllocation.host_id,
    HostAllocation.start_date,
    HostAllocation.end_date,
    HostAllocation.reservation_id,
    HostAllocation.lease_id,
)


def spans_since(session: Session, since: dt.datetime) -> list[SpanRow]:
    """Every allocation ending after ``since``: what an in-memory calendar starts from."""
    rows = session.execute(select(*_SPAN_COLUMNS).where(HostAllocation.end_date > since))
    return [SpanRow(*row) for row in rows]


def spans_of(session: Session, reservation_ids: Collection[str]) -> list[SpanRow]:
    query = select(*_SPAN_COLUMNS).where(HostAllocation.reservation_id.in_(list(reservation_ids)))
    return [SpanRow(*row) for row in session.execute(query)]


# -- healing (services/healing.py) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Suffering:
    """An allocation of a live lease on a failed host, still to come or under way."""

    allocation_id: str
    host_id: int
    reservation_id: str
    lease_id: str
    start: dt.datetime
    end: dt.datetime


def down_host_ids(session: Session) -> list[int]:
    return list(session.scalars(select(Host.id).where(Host.health == DOWN).order_by(Host.id)))


def unsteady_host_ids(session: Session, since: dt.datetime) -> set[int]:
    """Hosts down now or that went down after ``since``: healing uses none of them."""
    rows = session.scalars(
        select(Host.id).where((Host.health == DOWN) | (Host.last_down_at > since))
    )
    return set(rows)


def suffering(
    session: Session, host_ids: Collection[int], now: dt.datetime, until: dt.datetime | None
) -> list[Suffering]:
    """Allocations of live leases on ``host_ids`` that end after ``now`` and begin before
    ``until`` (None: any time), earliest first."""
    if not host_ids:
        return []
    query = (
        select(
            HostAllocation.id,
            HostAllocation.host_id,
            HostAllocation.reservation_id,
            HostAllocation.lease_id,
            HostAllocation.start_date,
            HostAllocation.end_date,
        )
        .join(Lease, Lease.id == HostAllocation.lease_id)
        .where(
            HostAllocation.host_id.in_(list(host_ids)),
            HostAllocation.end_date > now,
            Lease.deleted_at.is_(None),
        )
        .order_by(HostAllocation.start_date, HostAllocation.reservation_id, HostAllocation.host_id)
    )
    if until is not None:
        query = query.where(HostAllocation.start_date < until)
    return [Suffering(*row) for row in session.execute(query)]


def missing_hosts(session: Session, now: dt.datetime) -> list[Reservation]:
    """Reservations of live leases, not over by ``now``, that lack hosts healing could not
    replace; those starting first first."""
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


def move_allocation(
    session: Session, found: Suffering, new_host: int | None, at: dt.datetime
) -> None:
    """The allocation leaves its host from ``at`` on (all of it, if it had not begun) and, with
    ``new_host``, goes on there until its end: the past stays where it ran."""
    table = table_of(HostAllocation)
    rest = max(found.start, at)
    if found.start >= at:
        session.execute(delete(table).where(table.c.id == found.allocation_id))
    else:
        session.execute(update(table).where(table.c.id == found.allocation_id).values(end_date=at))
    if new_host is not None:
        add_allocation(session, found.reservation_id, found.lease_id, new_host, rest, found.end)


def add_allocation(
    session: Session,
    reservation_id: str,
    lease_id: str,
    host_id: int,
    start: dt.datetime,
    end: dt.datetime,
) -> None:
    session.execute(
        insert(table_of(HostAllocation)),
        [
            {
                "id": new_id(),
                "reservation_id": reservation_id,
                "lease_id": lease_id,
                "host_id": host_id,
                "start_date": start,
                "end_date": end,
            }
        ],
    )
