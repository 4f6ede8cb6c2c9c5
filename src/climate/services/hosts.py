"""Host inventory use cases: create, list, show, update, delete, properties, allocations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from climate import inputs
from climate.backends.base import (
    Enrol,
    Inspected,
    ResourceInUse,
    Timeboxed,
    UnknownResource,
    Withdraw,
)
from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import audit
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db import leases as lease_rows
from climate.db.allocation_listing import AllocationListing, Listed, Shown, lease_text, order
from climate.db.calendar_cache import CalendarCache
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import PROPERTY_VALUE_LENGTH, Host, ResourceProperty
from climate.domain.actor import Actor
from climate.errors import BackendError, Conflict, InvalidInput, MalformedQuery, NotFound
from climate.planner.query import parse_query
from climate.resources.ratios import RATIOS, parse_ratio
from climate.services import inventory
from climate.services.inventory import MAX_INT as MAX_INT

INT_COLUMNS = frozenset({"vcpus", "memory_mb", "local_gb", "hypervisor_version"})
TEXT_COLUMNS = frozenset({"service_name", "hypervisor_type", "cpu_info"})
READ_ONLY = frozenset({"id", "name", "hypervisor_hostname", "created_at", "updated_at", "trust_id"})


_Row = TypeVar("_Row")


@dataclass(frozen=True)
class PropertyInfo:
    name: str
    private: bool
    values: list[str]


class HostAllocations:
    """One host's allocations as the allocation endpoints show them."""

    __slots__ = ("host_id", "stamp", "since", "_rows", "_slots")

    def __init__(
        self,
        host_id: int,
        rows: Sequence[Shown],
        stamp: int | None = None,
        since: str = "",
        slots: Sequence[Shown] = (),
    ) -> None:
        self.host_id = host_id
        self.stamp = stamp
        """The host's stamp in its ``AllocationListing`` (both listings' with ``slots``) when
        these are all its rows ending after ``since`` (None: read from the database, or only
        some of them)."""
        self.since = since
        """``since`` as lease text (``allocation_listing.lease_text``)."""
        self._rows = rows
        self._slots = slots
        """Instance reservations' rows (with a ``count``) to show among ``rows``, each once
        per slot: merged only when read, since a host's kept answer usually needs none."""

    @property
    def reservations(self) -> Sequence[Shown]:
        """Of one table (instance reservations' with a ``count``), or whole hosts' with each
        instance slot as one more, by start then reservation."""
        if self._slots:
            # Both listings keep a host's rows in this order, and a slot's repeats stay side by
            # side: only a host with rows of both kinds is sorted.
            each = [row for row in self._slots for _ in range(_count(row))]
            self._rows = sorted([*self._rows, *each], key=order) if self._rows else each
            self._slots = ()
        return self._rows


class HostService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        """Enrols each new host (``Enrol``): what the cloud knows of it fills its fields."""
        self.listing = AllocationListing(host_rows.listed_allocations)
        self.slots = AllocationListing(
            instance_rows.listed_allocations, instance_rows.host_of_owner
        )
        """Instance reservations' rows: Blazar's host allocations show each slot too."""

    def create(self, actor: Actor, name: object, fields: Mapping[str, Any]) -> Host:
        """Register a host. Known inventory fields fill columns; all others become properties."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:post")
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput("name", "a host needs a non-empty name")
        if len(name) > 255:
            raise InvalidInput("name", "at most 255 characters")
        inputs.name_text("name", name)
        columns, properties = _split(fields, creating=True)
        found = self._enrol(name)
        columns.update(found[0])
        properties = {**found[1], **properties}
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            if host_rows.get_by_name(session, name) is not None:
                raise Conflict(f"name: a host named {name!r} already exists")
            host = Host(hypervisor_hostname=name, service_name=name, created_at=now)
            for key, value in columns.items():
                setattr(host, key, value)
            host_rows.add(session, host)
            host_rows.set_properties(session, host, properties)
            host_rows.bump_inventory(session)
            session.refresh(host)
            inventory.audit(
                session, now, actor, "host", "create", host.id, {"name": name, **fields}
            )
            self._wake_queue(session, now)
            return host

    def _enrol(self, name: str) -> tuple[dict[str, Any], dict[str, str | None]]:
        """What the backend's cloud knows of host ``name``: columns (its sizes and service
        host win over the request's) and properties (its traits; the request's win).

        :raises InvalidInput: the cloud knows no such host (nothing is written).
        :raises Conflict: servers run on it (as Blazar; nothing is written).
        :raises BackendError: the cloud failed or did not answer in time.
        """
        if self.backend is None:
            return {}, {}
        try:
            found = self.backend.one(Enrol("physical:host", name, vacant=True))
        except UnknownResource as exc:
            raise InvalidInput("name", str(exc)) from exc
        except ResourceInUse as exc:
            raise Conflict(f"name: {exc}") from exc
        except Exception as exc:
            raise BackendError(
                f"host {name}: backend {self.backend.name} failed to enrol it: {exc}"
            ) from exc
        if not isinstance(found, Inspected):
            return {}, {}
        columns, _ = _split(
            {k: v for k, v in found.fields.items() if k not in READ_ONLY}, creating=True
        )
        return columns, dict(found.properties)

    def _wake_queue(self, session: Session, now: dt.datetime) -> None:
        wake_queue(self.ctx, session, now)

    def list_all(self, actor: Actor, page: Page = FIRST_PAGE) -> Sequence[Host]:
        """:raises InvalidInput: ``marker`` is not a host id, or a bad ``sort_key``."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:get")
        with self.ctx.db.reader() as session:
            return self._page(session, page, host_rows.list_all)

    def get(self, actor: Actor, host_id: str) -> Host:
        self.ctx.policy.enforce(actor, "blazar:oshosts:get")
        with self.ctx.db.reader() as session:
            return _load(session, host_id)

    def update(self, actor: Actor, host_id: str, fields: Mapping[str, Any]) -> Host:
        self.ctx.policy.enforce(actor, "blazar:oshosts:put")
        columns, properties = _split(fields, creating=False)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            host = _load(session, host_id)  # first, as Blazar: an unknown host is a 404
            if not fields:
                raise InvalidInput("body", "No data to update")
            _refuse_changing_used(session, host, properties, now)
            for key, value in columns.items():
                setattr(host, key, value)
            host_rows.set_properties(session, host, properties)
            host_rows.bump_inventory(session)
            host.updated_at = now
            session.flush()
            session.refresh(host)
            inventory.audit(session, now, actor, "host", "update", host.id, dict(fields))
            self._wake_queue(session, now)
            return host

    def delete(self, actor: Actor, host_id: str) -> None:
        """Remove a host, refused (409, naming the leases) while it has current or future use,
        or (409, naming them) while the cloud runs servers on it, as Blazar; the backend's cloud
        stops offering it (``Withdraw``: out of the freepool)."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:delete")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            host = _load(session, host_id)
            holders = sorted(
                {
                    *host_rows.leases_holding(session, host.id, now),
                    *instance_rows.leases_holding(session, host.id, now),
                }
            )
            inventory.refuse_if_held(
                f"host {host.id} ({host.hypervisor_hostname})",
                holders,
                f"Can't delete host {host.id}. The host is reserved.",
            )
            inventory.audit(
                session, now, actor, "host", "delete", host.id, {"name": host.hypervisor_hostname}
            )
            instance_rows.remove_for_host(session, host.id)
            CalendarCache.mark_stale(session, "hosts", [instance_rows.usage_owner(host.id)])
            host_rows.remove(session, host, session.info["lock_version"])
            host_rows.bump_inventory(session)
            self._withdraw(host.hypervisor_hostname)

    def _withdraw(self, name: str) -> None:
        """The backend's cloud stops offering host ``name`` (it leaves the freepool). Called
        last in the delete's transaction: a failure rolls the delete back.

        :raises Conflict: servers run on it (as Blazar's HostHavingServers).
        :raises BackendError: the cloud failed or did not answer in time.
        """
        if self.backend is None:
            return
        try:
            self.backend.one(Withdraw("physical:host", name, vacant=True))
        except ResourceInUse as exc:
            raise Conflict(str(exc)) from exc
        except Exception as exc:
            raise BackendError(
                f"host {name}: backend {self.backend.name} failed to withdraw it: {exc}"
            ) from exc

    def properties(self, actor: Actor, *, include_private: bool) -> list[PropertyInfo]:
        """Extra property names in use with their values; private ones only for admins asking.
        Like Blazar, the public ones are shown to every caller the policy lets in."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:get_resource_properties")
        with self.ctx.db.reader() as session:
            settings = host_rows.property_settings(session)
            values = host_rows.property_values(session)
        show_private = include_private and self.ctx.policy.scope(actor) is None
        found = []
        for name in sorted(values):
            private = settings[name].private if name in settings else False
            if private and not show_private:
                continue
            found.append(PropertyInfo(name, private, values[name]))
        return found

    def property_setting(self, actor: Actor, name: str) -> ResourceProperty:
        """A property's setting as it is (kept from now on if it was never set), for whoever
        may change it."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:update_resource_properties")
        with self.ctx.db.transaction() as session:
            if name not in host_rows.property_values(session):
                raise NotFound("Resource property", name)
            setting = host_rows.property_settings(session).get(name)
            if setting is None:
                setting = host_rows.upsert_property_setting(
                    session, name, False, self.ctx.clock.now()
                )
            return setting

    def set_property_private(self, actor: Actor, name: str, private: object) -> ResourceProperty:
        self.ctx.policy.enforce(actor, "blazar:oshosts:update_resource_properties")
        if not isinstance(private, bool):
            raise InvalidInput("private", "must be true or false")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            if name not in host_rows.property_values(session):
                raise NotFound("Resource property", name)
            setting = host_rows.upsert_property_setting(session, name, private, now)
            audit.record(
                session,
                at=now,
                actor=actor,
                action="property.update",
                target_type="resource_property",
                target_id=name,
                detail={"private": private},
            )
            return setting

    def allocations(
        self,
        actor: Actor,
        *,
        host_id: str | None = None,
        lease_id: str | None = None,
        reservation_id: str | None = None,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[HostAllocations]:
        """Allocations per host from ``start`` (default now) on, a page of hosts (by id) at a
        time; a caller whom the ``admin`` rule does not cover sees only their project's. As in
        Blazar, an instance reservation shows once per instance slot it holds on the host."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:get_allocations", actor.owner())
        now = self.ctx.clock.now()
        since = start or now
        scope = self.ctx.policy.scope(actor)
        with self.ctx.db.reader() as session:
            if host_id is not None:
                ids: Sequence[int] = [_load(session, host_id).id]
            else:
                ids = self._page(session, page, host_rows.ids)  # no host loaded
            if not ids:
                return []
            if lease_id is None and reservation_id is None and end is None:
                kept = self.listing.per_host(session, ids, since, now)
                slots = self.slots.per_host(session, ids, since, now)
                if kept is not None and slots is not None:
                    text = lease_text(since)
                    return with_slots(_shown(kept, text, scope), _shown(slots, text, scope), text)
            filters: dict[str, Any] = {
                "lease_id": lease_id,
                "reservation_id": reservation_id,
                "project_id": scope,
                "start": since,
                "end": end,
            }
            rows = host_rows.allocations(session, host_range=(ids[0], ids[-1]), **filters)
            slot_rows = instance_rows.allocations(session, host_ids=ids, **filters)
        per_host = inventory.grouped(ids, rows, lambda row: row.host_id)
        per_slots = inventory.grouped(ids, slot_rows, lambda row: row.host_id)
        return with_slots(
            [(h, None, r) for h, r in per_host.items()],
            [(h, None, r) for h, r in per_slots.items()],
        )

    def _page(
        self,
        session: Session,
        page: Page,
        rows: Callable[..., Sequence[_Row]],
    ) -> Sequence[_Row]:
        """A page of hosts as ``rows`` lists them (the hosts, or their ids)."""
        return inventory.page_of(
            session,
            page,
            what="host",
            find=_find,
            rows=rows,
            sort_keys=host_rows.HOST_SORT_KEYS,
            cap=self.ctx.settings.max_page_size,
        )


def shown(
    kept: Sequence[tuple[int, int, Sequence[Listed], str]], since: str, scope: str | None
) -> list[HostAllocations]:
    """The kept rows (``AllocationListing.per_host``) ending after ``since`` (lease text), of
    project ``scope`` unless None."""
    return [HostAllocations(h, rows, stamp, since) for h, stamp, rows in _shown(kept, since, scope)]


def _shown(
    kept: Sequence[tuple[int, int, Sequence[Listed], str]], since: str, scope: str | None
) -> list[tuple[int, int | None, Sequence[Listed]]]:
    if scope is not None:
        return [
            (h, None, [r for r in rows if r.end_date > since and r.project_id == scope])
            for h, _, rows, _ in kept
        ]
    # Most hosts' rows all end after ``since`` (now, by default): shown as they are kept.
    return [
        (h, stamp, rows if earliest > since else [r for r in rows if r.end_date > since])
        for h, stamp, rows, earliest in kept
    ]


def with_slots(
    hosts: Sequence[tuple[int, int | None, Sequence[Shown]]],
    slots: Sequence[tuple[int, int | None, Sequence[Shown]]],
    since: str = "",
) -> list[HostAllocations]:
    """Each host's whole-host rows with its instance rows (of the same hosts, in the same
    order), each shown once per slot."""
    merged = []
    for (host_id, stamp, rows), (_, slot_stamp, used) in zip(hosts, slots, strict=True):
        both = None
        if stamp is not None and slot_stamp is not None:
            both = stamp << 64 | slot_stamp  # both listings' stamps, one key
        merged.append(HostAllocations(host_id, rows, both, since, used))
    return merged


def _count(row: Shown) -> int:
    count: int = getattr(row, "count", 1)
    return count


def wake_queue(ctx: ServiceContext, session: Session, now: dt.datetime) -> None:
    """A host added or changed (made reservable again, resized, back up) may be what waiting
    leases wait for: the manager serves the queue at once, not at its next poll."""
    if lease_rows.queue_waits(session):
        ctx.events_changed(session, now)


def _refuse_changing_used(
    session: Session, host: Host, changes: Mapping[str, str | None], now: dt.datetime
) -> None:
    """As Blazar: an extra property the host already has cannot be changed or removed while a
    reservation holding the host now or later asks for it in its ``resource_properties``; the
    reservation's choice would no longer hold (one it does not ask for changes freely).

    :raises Conflict: in Blazar's words, naming the properties.
    """
    had = {p.name for p in host.properties} & set(changes)
    if not had:
        return
    asked: set[str] = set()
    for params in [
        *host_rows.params_holding(session, host.id, now),
        *instance_rows.params_holding(session, host.id, now),
    ]:
        try:
            asked |= parse_query("", params.get("resource_properties")).properties()
        except MalformedQuery:  # stored before a stricter parser: it matches nothing anyway
            continue
    used = sorted(had & asked)
    if used:
        raise Conflict(
            f"Can't add extracapabilities {used} to Host {host.id} (reservations holding it now "
            "or later ask for them)"
        )


def load_host(session: Session, host_id: str) -> Host:
    """:raises NotFound: no host with that id."""
    return _load(session, host_id)


def _load(session: Session, host_id: str) -> Host:
    host = _find(session, host_id)
    if host is None:
        raise NotFound("Host", host_id, "host_id")
    return host


def _find(session: Session, host_id: str) -> Host | None:
    # Ids are 32-bit integers: a longer number is unknown, not a database error.
    text = str(host_id)
    known = _digits(text) and int(text) <= MAX_INT
    return host_rows.get(session, int(text)) if known else None


def _split(
    fields: Mapping[str, Any], *, creating: bool
) -> tuple[dict[str, Any], dict[str, str | None]]:
    columns: dict[str, Any] = {}
    properties: dict[str, str | None] = {}
    for key, value in fields.items():
        inventory.check_key(key, READ_ONLY)
        if key in INT_COLUMNS:
            columns[key] = _int(key, value)
        elif key in TEXT_COLUMNS:
            # cpu_info is a Text column: Nova's cpu_info JSON is often longer than 255.
            limit = None if key == "cpu_info" else PROPERTY_VALUE_LENGTH
            columns[key] = None if value is None else inventory.property_text(key, value, limit)
        elif key == "reservable":
            columns[key] = inventory.as_reservable(value)
        elif key in RATIOS and value is not None:
            properties[key] = str(parse_ratio(key, value))
        elif value is None:
            if creating:
                raise InvalidInput(key, "a new property needs a value")
            properties[key] = None
        else:
            properties[key] = inventory.property_text(key, value)
    return columns, properties


def _digits(text: str) -> bool:
    """An unsigned decimal short enough to convert (isdigit alone accepts "²" and 5000 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _int(key: str, value: object) -> int | None:
    return None if value is None else inputs.integer(key, value, minimum=0)
