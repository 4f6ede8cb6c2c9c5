"""SQLAlchemy 2 models. Migrations in ``db/migrations`` create exactly these tables."""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy import (
    JSON,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.orm.attributes import set_committed_value

from climate.db.types import UTCDateTime
from climate.entropy import random_bytes

NAME_LENGTH = 80
ID_LENGTH = 36
PROPERTY_NAME_LENGTH = 255
PROPERTY_VALUE_LENGTH = 255


_VERSION_MASK, _VERSION_7 = 0xF << 76, 0x7 << 76
_VARIANT_MASK, _VARIANT_RFC = 0x3 << 62, 0x2 << 62
_FREE_BITS = ~(_VERSION_MASK | _VARIANT_MASK)


def new_id() -> str:
    """A new row's id: a UUID of version 7 (RFC 9562), its first 48 bits the time in
    milliseconds, the other 74 free bits random. Ids made together sort together, so an index
    of them (every primary key; the lease ids other tables index) takes them at its right
    edge, a page already cached and, within a transaction, already written. Random (version 4)
    ids land on a random leaf each: an admission wrote about 3 pages more to SQLite's WAL."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(random_bytes(10))
    # uuid.UUID's own text, without its constructor's checks: half the cost, 8 ids an admission.
    h = "%032x" % (value & _FREE_BITS | _VERSION_7 | _VARIANT_RFC)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_ALLOCATIONS_OF = {
    "physical:host": "allocations",
    "virtual:instance": "instance_allocations",
    "virtual:volume": "volume_allocations",
}


def allocations_of(resource_type: str) -> str:
    """Which of a ``Reservation``'s four allocation collections a reservation of this type
    has (the others stay empty): every other type (devices, networks, floating IPs, plugins'
    items) has item allocations. Loads read only that table."""
    return _ALLOCATIONS_OF.get(resource_type, "item_allocations")


def table_of(model: type[Base]) -> Table:
    """A model's table, for Core statements that skip the ORM's unit of work (hot paths)."""
    return cast(Table, model.__table__)


class Base(DeclarativeBase):
    type_annotation_map = {dt.datetime: UTCDateTime, dict[str, Any]: JSON}


Row = TypeVar("Row", bound=Base)


def built(model: type[Row], **values: Any) -> Row:
    """A new ``model`` object outside any session, with ``values`` set as its attributes, and
    each collection given (a list of rows) set on both sides, as the constructor would.

    The constructor sends every attribute through the ORM's events: a lease cost 71 us to build
    that way, 3 here, and an admission builds several rows it only writes with Core inserts and
    renders. Set this way, the values are the object's committed state: added to a session it
    is inserted whole all the same, but a value set here is not an "unsaved change"."""
    new, relations = _making(model)
    row: Row = new()
    attributes = row.__dict__
    for key, value in values.items():
        if key not in relations:
            attributes[key] = value
            continue
        _attach(row, key, relations[key], value)
    return row


def attach(row: Base, key: str, children: list[Any]) -> None:
    """Set the collection ``key`` of ``row``, a ``built`` object, to ``children`` on both
    sides, as ``built`` does: with none of the ORM's events, which an assignment sends."""
    _attach(row, key, _making(type(row))[1][key], children)


def _attach(row: Base, key: str, back: str | None, children: list[Any]) -> None:
    set_committed_value(row, key, children)
    if back:
        for child in children:
            set_committed_value(child, back, row)


@functools.cache
def _making(model: type[Base]) -> tuple[Callable[[], Any], dict[str, str | None]]:
    """How to make a bare ``model`` object, and its relationships with their other side."""
    mapper = inspect(model)
    relations: dict[str, str | None] = {r.key: r.back_populates for r in mapper.relationships}
    return mapper.class_manager.new_instance, relations


class Timestamped:
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class Lock(Base):
    """Named rows whose update serialises a critical section on every database."""

    __tablename__ = "locks"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class ManagerProcess(Base):
    """A running manager (PostgreSQL): its heartbeat tells the others whether its event claims
    are still being worked on (``db/managers.py``)."""

    __tablename__ = "managers"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[dt.datetime]
    heartbeat_at: Mapped[dt.datetime]


class Host(Timestamped, Base):
    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hypervisor_hostname: Mapped[str] = mapped_column(String(255), unique=True)
    service_name: Mapped[str | None] = mapped_column(String(255))
    hypervisor_type: Mapped[str | None] = mapped_column(String(255))
    hypervisor_version: Mapped[int | None] = mapped_column(Integer)
    vcpus: Mapped[int | None] = mapped_column(Integer)
    memory_mb: Mapped[int | None] = mapped_column(Integer)
    local_gb: Mapped[int | None] = mapped_column(Integer)
    cpu_info: Mapped[str | None] = mapped_column(Text)
    reservable: Mapped[bool] = mapped_column(Boolean, default=True)
    status: Mapped[str | None] = mapped_column(String(255))
    trust_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    health: Mapped[str] = mapped_column(String(16), default="up", server_default="up")
    """``up`` or ``down`` (down, forced down or disabled in the cloud): a down host is not
    reservable and its reservations are healed (services/healing.py)."""
    health_reason: Mapped[str | None] = mapped_column(Text, default=None)
    health_since: Mapped[dt.datetime | None] = mapped_column(default=None)
    last_down_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    """When the host last went down: healing uses no host that failed this recently
    (``heal_interval_seconds``), so a flapping host does not pull reservations back and forth."""
    properties: Mapped[list[HostProperty]] = relationship(
        back_populates="host", cascade="all, delete-orphan", lazy="selectin"
    )


class HostProperty(Base):
    __tablename__ = "host_properties"
    host_id: Mapped[int] = mapped_column(
        ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(PROPERTY_NAME_LENGTH), primary_key=True)
    value: Mapped[str] = mapped_column(String(PROPERTY_VALUE_LENGTH))
    host: Mapped[Host] = relationship(back_populates="properties")


class ResourceProperty(Timestamped, Base):
    """Per-property settings, like Blazar's resource_properties (visibility)."""

    __tablename__ = "resource_properties"
    __table_args__ = (UniqueConstraint("resource_type", "property_name"),)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    resource_type: Mapped[str] = mapped_column(String(64))
    property_name: Mapped[str] = mapped_column(String(PROPERTY_NAME_LENGTH))
    private: Mapped[bool] = mapped_column(Boolean, default=False)


class Lease(Timestamped, Base):
    __tablename__ = "leases"
    __table_args__ = (
        # A live lease's name is its project's own (Blazar's rule): the database keeps it.
        Index(
            "uq_leases_live_name",
            "project_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index("ix_leases_status", "status"),
        # Partial: most leases have no series, and an index page written for each cost 4 KB.
        Index(
            "ix_leases_series",
            "series_id",
            "occurrence",
            sqlite_where=text("series_id IS NOT NULL"),
            postgresql_where=text("series_id IS NOT NULL"),
        ),
        Index("ix_leases_project_end", "project_id", "end_date"),
        # The default listing, in order, without sorting every lease ever made.
        Index(
            "ix_leases_live_created",
            "created_at",
            "id",
            "status",
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    project_id: Mapped[str] = mapped_column(String(255))
    user_id: Mapped[str] = mapped_column(String(255))
    trust_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    before_end_date: Mapped[dt.datetime | None]
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    degraded: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    lease_type: Mapped[str] = mapped_column(String(16), default="scheduled")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    """Waiting leases are served by priority (higher first), then by ``created_at``."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Admission attempts of a retry lease so far."""
    max_attempts: Mapped[int | None] = mapped_column(Integer, default=None)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    deadline: Mapped[dt.datetime | None] = mapped_column(default=None)
    """A best-effort lease times out at this instant if still waiting."""
    hold_expires_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    requested_earliest_start: Mapped[dt.datetime | None] = mapped_column(default=None)
    requested_latest_end: Mapped[dt.datetime | None] = mapped_column(default=None)
    requested_duration_seconds: Mapped[int | None] = mapped_column(Integer, default=None)
    """A flexible lease's request (docs/admission.md): it was placed in this window."""
    series_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), default=None)
    occurrence: Mapped[dt.datetime | None] = mapped_column(default=None)
    """The series' instant this lease was made for (its recurrence id): kept when the
    occurrence is moved, so the series knows which of its instants are taken."""
    reminders: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    """Its reminders' offsets before ``end_date``, in seconds, longest first (None: none).
    Kept from creation, so a lease without events yet (waiting, held) gets them when admitted."""
    reservations: Mapped[list[Reservation]] = relationship(
        back_populates="lease", lazy="selectin", order_by="Reservation.created_at"
    )
    events: Mapped[list[Event]] = relationship(
        back_populates="lease", lazy="selectin", order_by="[Event.time, Event.seq]"
    )


class LeaseRevision(Base):
    """How often a lease's rows (its own, its reservations', events' and allocations') have
    changed, counted by the database's triggers on SQLite (migrations 0023, 0026); no row: never
    since it was written. PostgreSQL has no trigger: the table stays empty there."""

    __tablename__ = "lease_revisions"
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer, index=True, server_default="0")
    """The sequence number of its last change, over every lease (migration 0026): a lease
    deleted outright keeps its row."""


class LeaseSeries(Timestamped, Base):
    """A recurring lease: an iCalendar RRULE (with EXDATEs) from ``first_start``, each
    occurrence ``duration_seconds`` long, made from ``body`` (a lease body without dates).
    Its occurrences are ordinary leases with ``series_id`` set."""

    __tablename__ = "lease_series"
    __table_args__ = (Index("ix_lease_series_project", "project_id", "name"),)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    project_id: Mapped[str] = mapped_column(String(255))
    user_id: Mapped[str] = mapped_column(String(255))
    rrule: Mapped[str] = mapped_column(Text)
    exdates: Mapped[list[str]] = mapped_column(JSON)
    first_start: Mapped[dt.datetime]
    duration_seconds: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]]
    deleted_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class Reservation(Timestamped, Base):
    __tablename__ = "reservations"
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    lease_id: Mapped[str] = mapped_column(ForeignKey("leases.id"), index=True)
    resource_type: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str] = mapped_column(String(ID_LENGTH), default=new_id)
    status: Mapped[str] = mapped_column(String(16))
    missing_resources: Mapped[bool] = mapped_column(Boolean, default=False)
    resources_changed: Mapped[bool] = mapped_column(Boolean, default=False)
    missing_hosts: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    """Names of the failed hosts healing found no replacement for (``missing_resources``)."""
    params: Mapped[dict[str, Any]]
    lease: Mapped[Lease] = relationship(back_populates="reservations")
    allocations: Mapped[list[HostAllocation]] = relationship(
        back_populates="reservation", lazy="selectin", order_by="HostAllocation.host_id"
    )
    item_allocations: Mapped[list[ItemAllocation]] = relationship(
        back_populates="reservation", lazy="selectin", order_by="ItemAllocation.item_id"
    )
    volume_allocations: Mapped[list[VolumeAllocation]] = relationship(
        back_populates="reservation", lazy="selectin", order_by="VolumeAllocation.pool_id"
    )
    instance_allocations: Mapped[list[InstanceAllocation]] = relationship(
        back_populates="reservation", lazy="selectin", order_by="InstanceAllocation.host_id"
    )


class HostAllocation(Base):
    """Host ``host_id`` belongs to ``reservation_id`` over [start_date, end_date)."""

    __tablename__ = "host_allocations"
    __table_args__ = (
        Index("ix_host_allocations_start", "start_date"),
        Index("ix_host_allocations_end", "end_date"),
        Index("ix_host_allocations_host", "host_id", "start_date"),
    )
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    reservation_id: Mapped[str] = mapped_column(ForeignKey("reservations.id"), index=True)
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    reservation: Mapped[Reservation] = relationship(back_populates="allocations")


class Item(Timestamped, Base):
    """A whole thing reserved exclusively over time: a device, a network segment, a floating IP.

    ``kind`` says which; ``pool`` groups items of a kind (a floating IP's network, a segment's
    physical network; "" when there is none) and ``name`` is unique within it (the address, the
    segment id, the device name)."""

    __tablename__ = "items"
    __table_args__ = (UniqueConstraint("kind", "pool", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    reservable: Mapped[bool] = mapped_column(Boolean, default=True)
    properties: Mapped[list[ItemProperty]] = relationship(
        back_populates="item", cascade="all, delete-orphan", lazy="selectin"
    )


class ItemProperty(Base):
    __tablename__ = "item_properties"
    item_id: Mapped[int] = mapped_column(
        ForeignKey("items.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(PROPERTY_NAME_LENGTH), primary_key=True)
    value: Mapped[str] = mapped_column(String(PROPERTY_VALUE_LENGTH))
    item: Mapped[Item] = relationship(back_populates="properties")


class ItemAllocation(Base):
    """Item ``item_id`` belongs to ``reservation_id`` over [start_date, end_date); on
    PostgreSQL an exclusion constraint refuses two overlapping rows of one item."""

    __tablename__ = "item_allocations"
    __table_args__ = (
        Index("ix_item_allocations_start", "start_date"),
        Index("ix_item_allocations_end", "end_date"),
        Index("ix_item_allocations_item", "item_id", "start_date"),
    )
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    reservation_id: Mapped[str] = mapped_column(ForeignKey("reservations.id"), index=True)
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id"))
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    reservation: Mapped[Reservation] = relationship(back_populates="item_allocations")


class VolumePool(Timestamped, Base):
    """Storage of ``capacity_gb`` from which volumes are reserved over time."""

    __tablename__ = "volume_pools"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    capacity_gb: Mapped[int] = mapped_column(Integer)
    reservable: Mapped[bool] = mapped_column(Boolean, default=True)
    properties: Mapped[list[VolumePoolProperty]] = relationship(
        back_populates="pool", cascade="all, delete-orphan", lazy="selectin"
    )


class VolumePoolProperty(Base):
    __tablename__ = "volume_pool_properties"
    pool_id: Mapped[int] = mapped_column(
        ForeignKey("volume_pools.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(PROPERTY_NAME_LENGTH), primary_key=True)
    value: Mapped[str] = mapped_column(String(PROPERTY_VALUE_LENGTH))
    pool: Mapped[VolumePool] = relationship(back_populates="properties")


class VolumeAllocation(Base):
    """``size_gb`` of pool ``pool_id`` belong to ``reservation_id`` over [start_date,
    end_date). Rows of one pool overlap; their sum at any instant stays within its capacity."""

    __tablename__ = "volume_allocations"
    __table_args__ = (Index("ix_volume_allocations_pool", "pool_id", "start_date"),)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    reservation_id: Mapped[str] = mapped_column(ForeignKey("reservations.id"), index=True)
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    pool_id: Mapped[int] = mapped_column(ForeignKey("volume_pools.id"))
    size_gb: Mapped[int] = mapped_column(Integer)
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    reservation: Mapped[Reservation] = relationship(back_populates="volume_allocations")


class InstanceAllocation(Base):
    """``count`` instances of ``reservation_id`` on host ``host_id`` over [start_date,
    end_date), using ``vcpus``, ``memory_mb`` and ``disk_gb`` of it in all. Rows of one host
    overlap; at every instant their sums stay within its ratio-scaled size, and no whole-host
    allocation of that host overlaps them."""

    __tablename__ = "instance_allocations"
    __table_args__ = (
        Index("ix_instance_allocations_start", "start_date"),
        Index("ix_instance_allocations_end", "end_date"),
        Index("ix_instance_allocations_host", "host_id", "start_date"),
    )
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    reservation_id: Mapped[str] = mapped_column(ForeignKey("reservations.id"), index=True)
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    count: Mapped[int] = mapped_column(Integer)
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_mb: Mapped[int] = mapped_column(Integer)
    disk_gb: Mapped[int] = mapped_column(Integer)
    start_date: Mapped[dt.datetime]
    end_date: Mapped[dt.datetime]
    reservation: Mapped[Reservation] = relationship(back_populates="instance_allocations")


class AllocationChange(Base):
    """Which reservations' allocations changed at which admission version: lets every process
    bring its in-memory calendar up to date by reloading only those."""

    __tablename__ = "allocation_changes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(Integer, index=True)
    reservation_id: Mapped[str] = mapped_column(String(ID_LENGTH))


class Event(Timestamped, Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_due", "status", "not_before"),)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    lease_id: Mapped[str] = mapped_column(ForeignKey("leases.id"), index=True)
    event_type: Mapped[str] = mapped_column(String(32))
    time: Mapped[dt.datetime]
    not_before: Mapped[dt.datetime]
    """When the event may next run: its time, or later after a failed attempt."""
    priority: Mapped[int] = mapped_column(Integer)
    """Order among events of different leases due at the same time (lower first)."""
    seq: Mapped[int] = mapped_column(Integer)
    """Place in its lease's life: no event runs before its lease's earlier ones are over."""
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_until: Mapped[dt.datetime | None]
    done_at: Mapped[dt.datetime | None]
    lease: Mapped[Lease] = relationship(back_populates="events")


class OutboxMessage(Base):
    """A notification to deliver to one URL, written in the transaction that caused it."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_due", "status", "next_attempt_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    topic: Mapped[str] = mapped_column(String(64))
    lease_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    payload: Mapped[dict[str, Any]]
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime]
    delivered_at: Mapped[dt.datetime | None]


class Assignment(Base):
    """The standalone backend's record of which project holds which resource, and when."""

    __tablename__ = "assignments"
    __table_args__ = (UniqueConstraint("reservation_id", "resource_type", "resource_id"),)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True, default=new_id)
    reservation_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    lease_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    project_id: Mapped[str] = mapped_column(String(255))
    resource_type: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str] = mapped_column(String(255))
    assigned_at: Mapped[dt.datetime]
    released_at: Mapped[dt.datetime | None]
    start_policy: Mapped[str] = mapped_column(String(16), default="auto")
    end_policy: Mapped[str] = mapped_column(String(16), default="release")
    """The reservation's at its start, then at its end (docs/policies.md)."""
    state: Mapped[str] = mapped_column(String(16), default="running")
    """What the backend did with the project's workload: ``running`` or ``held`` (a manual
    start) while the reservation runs; ``released``, ``deleted``, ``suspended``,
    ``snapshotted`` or ``kept`` (until acknowledged, then ``released``) after its end."""


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    secret_hash: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(255))
    project_id: Mapped[str] = mapped_column(String(255))
    roles: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
