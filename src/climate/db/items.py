"""Items (devices, network segments, floating IPs): inventory and allocation queries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from climate.db import allocations as allocation_rows
from climate.db.allocations import narrowed
from climate.db.hosts import AllocationRow, Loaded, SpanRow
from climate.db.leases import after_marker, keyset_order
from climate.db.tables import Item, ItemAllocation, ItemProperty, Lease
from climate.db.types import iso_text

SORT_KEYS = ("id", "name", "created_at")


class PropertyRow(Protocol):
    name: str
    value: str


def set_properties(
    owned: list[Any], make: Callable[[str, str], Any], changes: dict[str, str | None]
) -> None:
    """Set (or, for None, remove) the named properties in ``owned``, a property relationship;
    ``make`` builds a new property row from a name and a value."""
    current: dict[str, PropertyRow] = {p.name: p for p in owned}
    for name, value in changes.items():
        if value is None:
            if name in current:
                owned.remove(current[name])
        elif name in current:
            current[name].value = value
        else:
            owned.append(make(name, value))


def get(session: Session, kind: str, item_id: int) -> Item | None:
    item = session.get(Item, item_id)
    return item if item is not None and item.kind == kind else None


def find(session: Session, kind: str, pool: str, name: str) -> Item | None:
    query = select(Item).where(Item.kind == kind, Item.pool == pool, Item.name == name)
    return session.scalars(query).first()


def list_page(
    session: Session,
    kind: str,
    *,
    limit: int | None = None,
    marker: Item | None = None,
    sort_key: str = "id",
    descending: bool = False,
) -> Sequence[Item]:
    """Items of ``kind`` in (``sort_key``, id) order, the ``limit`` after ``marker`` if given."""
    column = getattr(Item, sort_key)
    query = select(Item).where(Item.kind == kind)
    query = query.order_by(*keyset_order(column, Item.id, descending))
    if marker is not None:
        query = query.where(
            after_marker(column, Item.id, getattr(marker, sort_key), marker.id, descending)
        )
    return session.scalars(query.limit(limit)).all()


def add(session: Session, item: Item, properties: dict[str, str | None]) -> Item:
    set_properties(item.properties, _property, properties)
    session.add(item)
    session.flush()
    return item


def _property(name: str, value: str) -> ItemProperty:
    return ItemProperty(name=name, value=value)


def update(session: Session, item: Item, properties: dict[str, str | None]) -> None:
    set_properties(item.properties, _property, properties)
    session.flush()


def remove(session: Session, item: Item, version: int) -> None:
    """Delete ``item`` with its (past) allocations, logging them for in-memory calendars."""
    allocation_rows.remove(session, item, ItemAllocation.item_id, version)


def leases_holding(session: Session, item_id: int, since: dt.datetime) -> list[str]:
    """Ids of the live leases with an allocation of ``item_id`` that ends after ``since``."""
    return allocation_rows.leases_holding(session, ItemAllocation.item_id, item_id, since)


@dataclass(frozen=True, slots=True)
class ItemRecord:
    """A reservable item as admission sees it: id, pool, name and every queryable property."""

    id: int
    pool: str
    name: str
    properties: dict[str, str | int | None]


def reservable_records(session: Session, kind: str) -> list[ItemRecord]:
    """Every reservable item of ``kind`` with its extra properties: two queries, no ORM."""
    rows = session.execute(
        select(Item.id, Item.pool, Item.name)
        .where(Item.kind == kind, Item.reservable.is_(True))
        .order_by(Item.id)
    )
    records = {row.id: ItemRecord(row.id, row.pool, row.name, {}) for row in rows}
    extras = session.execute(
        select(ItemProperty.item_id, ItemProperty.name, ItemProperty.value)
        .join(Item, Item.id == ItemProperty.item_id)
        .where(Item.kind == kind, Item.reservable.is_(True))
    )
    for item_id, name, value in extras:
        records[item_id].properties[name] = value
    return list(records.values())


_SPAN_COLUMNS = (
    ItemAllocation.item_id,
    ItemAllocation.start_date,
    ItemAllocation.end_date,
    ItemAllocation.reservation_id,
)


class ItemAllocations:
    """The allocations of one kind of item, as an in-memory calendar reads and writes them
    (``db.calendar_cache.AllocationStore``)."""

    def __init__(self, kind: str) -> None:
        self.name = f"items:{kind}"
        self.kind = kind

    def spans_since(self, session: Session, since: dt.datetime) -> Loaded:
        rows = session.execute(
            select(*_SPAN_COLUMNS)
            .join(Item, Item.id == ItemAllocation.item_id)
            .where(Item.kind == self.kind, ItemAllocation.end_date > since)
        )
        return Loaded([SpanRow(*row) for row in rows])

    def spans_of(self, session: Session, reservation_ids: Collection[str]) -> Loaded:
        rows = session.execute(
            select(*_SPAN_COLUMNS)
            .join(Item, Item.id == ItemAllocation.item_id)
            .where(Item.kind == self.kind, ItemAllocation.reservation_id.in_(reservation_ids))
        )
        return Loaded([SpanRow(*row) for row in rows])

    def replace(
        self,
        session: Session,
        reservation_id: str,
        lease_id: str,
        item_ids: Iterable[int],
        start: dt.datetime,
        end: dt.datetime,
        *,
        fresh: bool = False,
        since: dt.datetime | None = None,
        starts: Mapping[int, dt.datetime] | None = None,
    ) -> list[ItemAllocation]:
        """Give the reservation exactly ``item_ids`` over [start, end) (``fresh``: it holds
        none yet; ``since``: it runs, see ``db.allocations.replace``); returns its rows as
        objects outside the session."""
        return allocation_rows.replace(
            session,
            ItemAllocation.item_id,
            reservation_id,
            lease_id,
            item_ids,
            start,
            end,
            fresh=fresh,
            since=since,
            starts=starts,
        )

    def truncate(self, session: Session, reservation_id: str, at: dt.datetime) -> None:
        """End the reservation's allocations at ``at`` (drop those that had not begun)."""
        allocation_rows.truncate(session, ItemAllocation, reservation_id, at)


def allocations(
    session: Session,
    kind: str,
    *,
    item_ids: Collection[int],
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> list[AllocationRow]:
    """Allocations of live leases on ``item_ids`` overlapping [start, end), filtered as asked
    (``AllocationRow.host_id`` is the item id)."""
    query = (
        select(
            ItemAllocation.item_id,
            ItemAllocation.reservation_id,
            ItemAllocation.lease_id,
            iso_text(ItemAllocation.start_date),
            iso_text(ItemAllocation.end_date),
        )
        .join(Lease, Lease.id == ItemAllocation.lease_id)
        .join(Item, Item.id == ItemAllocation.item_id)
        .where(
            Lease.deleted_at.is_(None),
            Item.kind == kind,
            ItemAllocation.item_id.in_(list(item_ids)),
        )
        .order_by(ItemAllocation.item_id, ItemAllocation.start_date)
    )
    query = narrowed(
        query,
        ItemAllocation,
        lease_id=lease_id,
        reservation_id=reservation_id,
        project_id=project_id,
        start=start,
        end=end,
    )
    return list(map(AllocationRow._make, session.connection().execute(query).all()))
