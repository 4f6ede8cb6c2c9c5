"""A Blazar database's rows mapped to Climate's (``services/blazar_import.py`` writes them): its
hosts, floating IPs and extra capabilities, its leases with their reservations, events and
allocations, and the report of what was mapped and what could not be."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from climate.context import ServiceContext
from climate.db.blazar_import import BlazarRows, Present, Row, Unreadable, utc
from climate.db.tables import (
    PROPERTY_VALUE_LENGTH,
    Event,
    Host,
    HostAllocation,
    HostProperty,
    InstanceAllocation,
    Item,
    ItemAllocation,
    ItemProperty,
    Lease,
    Reservation,
    ResourceProperty,
)
from climate.domain.status import (
    EVENT_ORDER,
    LIFECYCLE_ORDER,
    EventStatus,
    EventType,
    LeaseStatus,
    ReservationStatus,
)
from climate.errors import InvalidInput
from climate.services.blazar_terms import (
    DERIVED_STATUS,
    FLOATING,
    FLOATING_KIND,
    HOST_COLUMNS,
    HOSTS,
    INSTANCES,
    KEPT_AS_PROPERTY,
    SAME_STATUS,
    ImportReport,
    by,
    digits,
    raw_params,
)

STAMP = "%Y-%m-%d %H:%M:%S"


class BlazarMapping:
    """Blazar rows to Climate objects, noting in ``report`` what it writes and cannot map."""

    def __init__(
        self,
        ctx: ServiceContext,
        source: BlazarRows,
        present: Present,
        unknown_hosts: Mapping[str, str],
        report: ImportReport,
        now: dt.datetime,
    ) -> None:
        self.ctx = ctx
        self.source = source
        self.present = present
        self.unknown_hosts = unknown_hosts
        self.report = report
        self.now = now
        self.host_ids: dict[str, int] = {}
        """Blazar host id -> Climate host id, for the hosts imported or already there."""
        self.host_names = {h["id"]: h["hypervisor_hostname"] for h in source.of("computehosts")}
        self.item_ids: dict[str, int] = {}
        self.item_names = {
            f["id"]: f"{f['floating_ip_address']} ({f['floating_network_id']})"
            for f in source.of("floatingips")
        }
        self._new_hosts: list[tuple[str, Host]] = []
        self._new_items: list[tuple[str, Item]] = []

    # -- inventory --------------------------------------------------------------------------

    def inventory(self) -> tuple[list[Host], list[Item], list[ResourceProperty]]:
        hosts = self._hosts()
        items = self._floating_ips()
        settings = self._property_settings()
        return hosts, items, settings

    def resolve_ids(self) -> None:
        """After the inventory is flushed: the ids the new rows got."""
        for blazar_id, host in self._new_hosts:
            self.host_ids[blazar_id] = host.id
        for blazar_id, item in self._new_items:
            self.item_ids[blazar_id] = item.id

    def _hosts(self) -> list[Host]:
        capabilities = self._capabilities()
        taken = set(self.present.host_names)
        numbered = {int(h["id"]) for h in self.source.of("computehosts") if digits(h["id"])}
        new: list[Host] = []
        named: dict[str, str] = {}
        for row in self.source.of("computehosts"):
            blazar_id, name = row["id"], row["hypervisor_hostname"]
            if not name:
                self.report.unmappable.append(f"host {blazar_id}: it has no hypervisor_hostname")
                continue
            if name in named:  # Blazar's schema does not make names unique; Climate's does
                self.report.unmappable.append(
                    f"host {blazar_id}: {name!r} is also Blazar host {named[name]}'s name"
                )
                continue
            named[name] = blazar_id
            if name in self.unknown_hosts:
                self.report.unmappable.append(
                    f"host {name!r}: the cloud no longer knows it ({self.unknown_hosts[name]})"
                )
                continue
            existing = self.present.hosts.get(name)
            if existing is not None:
                self.host_ids[blazar_id] = existing.id
                self.report.already["hosts"] += 1
                continue
            created, updated = self._stamps(row, f"host {name!r}")
            host = Host(
                hypervisor_hostname=name,
                reservable=bool(row["reservable"]),
                created_at=created,
                updated_at=updated,
            )
            for column in HOST_COLUMNS:
                setattr(host, column, row.get(column))
            if digits(blazar_id) and int(blazar_id) not in taken:
                host.id = int(blazar_id)
                taken.add(host.id)
            else:
                why = "is not a number" if not digits(blazar_id) else "is another host's"
                self.report.notes.append(
                    f"host {name!r}: Blazar id {blazar_id} {why} in Climate; it gets a new id"
                )
            properties = dict(capabilities.get(blazar_id, {}))
            for column in KEPT_AS_PROPERTY:
                if row.get(column) is not None:
                    properties.setdefault(column, str(row[column]))
            host.properties = [
                HostProperty(name=k, value=v[:PROPERTY_VALUE_LENGTH])
                for k, v in sorted(properties.items())
            ]
            new.append(host)
            self._new_hosts.append((blazar_id, host))
            self.report.written["hosts"] += 1
            self.report.written["host properties"] += len(host.properties)
        # New hosts without a kept id must not take an id a later Blazar host keeps.
        next_id = max([*taken, *numbered, 0]) + 1
        for host in new:
            if host.id is None:
                host.id = next_id
                next_id += 1
        return new

    def _capabilities(self) -> dict[str, dict[str, str]]:
        names = {p["id"]: p["property_name"] for p in self.source.of("resource_properties")}
        found: dict[str, dict[str, str]] = defaultdict(dict)
        for row in self.source.of("computehost_extra_capabilities"):
            # Blazar before 2023 named the capability in the row itself.
            name = names.get(row.get("property_id")) or row.get("capability_name")
            if name:
                found[row["computehost_id"]][name] = str(row["capability_value"])
        return found

    def _property_settings(self) -> list[ResourceProperty]:
        new = []
        for row in self.source.of("resource_properties"):
            if row["resource_type"] != HOSTS or row["property_name"] in self.present.property_names:
                continue
            created, updated = self._stamps(row, f"resource property {row['property_name']!r}")
            new.append(
                ResourceProperty(
                    id=row["id"],
                    resource_type=HOSTS,
                    property_name=row["property_name"],
                    private=bool(row["private"]),
                    created_at=created,
                    updated_at=updated,
                )
            )
        return new

    def _floating_ips(self) -> list[Item]:
        new = []
        for row in self.source.of("floatingips"):
            key = (row["floating_network_id"], row["floating_ip_address"])
            existing = self.present.items.get(key)
            if existing is not None:
                self.item_ids[row["id"]] = existing.id
                self.report.already["floating IPs"] += 1
                continue
            created, updated = self._stamps(row, f"floating IP {self.item_names[row['id']]}")
            item = Item(
                kind=FLOATING_KIND,
                pool=key[0],
                name=key[1],
                reservable=bool(row["reservable"]),
                created_at=created,
                updated_at=updated,
                properties=[ItemProperty(name="subnet_id", value=row["subnet_id"])],
            )
            new.append(item)
            self._new_items.append((row["id"], item))
            self.report.written["floating IPs"] += 1
        if new:
            self.report.notes.append(
                f"{len(new)} floating IPs get new (numeric) ids; their addresses and networks "
                "are kept"
            )
        return new

    # -- leases -----------------------------------------------------------------------------

    def leases(self) -> tuple[list[Lease], set[int]]:
        """The leases not in Climate yet, and the hosts their instance reservations use."""
        self.resolve_ids()
        reservations = by(self.source.of("reservations"), "lease_id")
        events = by(self.source.of("events"), "lease_id")
        details = {
            table: {r["reservation_id"]: r for r in self.source.of(table)}
            for table in (
                "computehost_reservations",
                "instance_reservations",
                "floatingip_reservations",
            )
        }
        host_allocations = by(self.source.of("computehost_allocations"), "reservation_id")
        fip_allocations = by(self.source.of("floatingip_allocations"), "reservation_id")
        required = by(self.source.of("required_floatingips"), "floatingip_reservation_id")
        out: list[Lease] = []
        instance_hosts: set[int] = set()
        names = set(self.present.lease_names)
        for row in self.source.of("leases"):
            if row["id"] in self.present.lease_ids:
                self.report.already["leases"] += 1
                continue
            where = f"lease {row['id']} ({row['name']})"
            window = self._window(row, where)
            if window is None:
                continue
            name = (str(row["project_id"]), str(row["name"]))
            if name in names:
                self.report.unmappable.append(
                    f"{where}: project {name[0]} has a live lease of that name"
                )
                continue
            lease = self._lease(row, window, events.get(row["id"], []))
            if lease is None:
                continue
            made = []
            for res in reservations.get(row["id"], []):
                reservation = self._reservation(
                    lease, res, details, host_allocations, fip_allocations, required
                )
                if reservation is None:
                    break
                made.append(reservation)
            else:
                lease.reservations = made
                for reservation in made:
                    instance_hosts.update(a.host_id for a in reservation.instance_allocations)
                self._count(lease)
                out.append(lease)
                names.add(name)
                continue
            self.report.unmappable.append(
                f"lease {row['id']} ({row['name']}): left out with its reservations"
            )
        return out, instance_hosts

    def _count(self, lease: Lease) -> None:
        written = self.report.written
        written["leases"] += 1
        written["reservations"] += len(lease.reservations)
        written["events"] += len(lease.events)
        for r in lease.reservations:
            written["host allocations"] += len(r.allocations)
            written["instance allocations"] += len(r.instance_allocations)
            written["floating IP allocations"] += len(r.item_allocations)

    def _window(self, row: Row, where: str) -> tuple[dt.datetime, dt.datetime] | None:
        """The lease's start and end, when it has an owner and they make a window Climate
        would admit (Blazar refuses a lease that ends at or before its start, too); else the
        reason is reported as unmappable."""
        missing = [c for c in ("project_id", "user_id") if not str(row[c] or "").strip()]
        odd = [c for c in ("start_date", "end_date") if isinstance(row[c], Unreadable)]
        if missing:  # nullable in Blazar's schema, though its API always sets them
            why = f"it has no {' and no '.join(missing)}"
        elif odd:
            why = f"{odd[0]} {row[odd[0]].text!r} is not a date"
        else:
            start, end = utc(row["start_date"]), utc(row["end_date"])
            assert start is not None and end is not None  # NOT NULL in Blazar
            if end > start:
                return start, end
            why = f"end_date {end:{STAMP}} is not after start_date {start:{STAMP}}"
        self.report.unmappable.append(f"{where}: {why}")
        return None

    def _lease(
        self, row: Row, window: tuple[dt.datetime, dt.datetime], blazar_events: Sequence[Row]
    ) -> Lease | None:
        where = f"lease {row['id']} ({row['name']})"
        events = []
        for e in blazar_events:
            event = self._event(e, where)
            if event is None:
                return None
            events.append(event)
        status = self._status(row, events, where)
        if status is None:
            return None
        start, end = window
        before_end = [e.time for e in events if e.event_type == EventType.BEFORE_END_LEASE]
        created, updated = self._stamps(row, where)
        return Lease(
            id=row["id"],
            name=row["name"],
            project_id=row["project_id"],
            user_id=row["user_id"],
            trust_id=row["trust_id"],
            start_date=start,
            end_date=end,
            before_end_date=min(before_end) if before_end else None,
            status=status,
            status_reason=None,
            degraded=bool(row.get("degraded")),
            lease_type="scheduled",
            priority=0,
            attempts=0,
            created_at=created,
            updated_at=updated,
            events=sorted(events, key=lambda e: e.time),
        )

    def _status(self, row: Row, events: Sequence[Event], where: str) -> str | None:
        status = str(row["status"])
        if status in SAME_STATUS:
            return status
        if status in DERIVED_STATUS:
            started = any(
                e.event_type == EventType.START_LEASE and e.status == EventStatus.DONE
                for e in events
            )
            mapped = LeaseStatus.ACTIVE if started else LeaseStatus.PENDING
            self.report.notes.append(
                f"{where}: Blazar left it {status}; imported as {mapped} (its events say so)"
            )
            return str(mapped)
        self.report.unmappable.append(
            f"{where}: status {status!r} has no Climate equivalent"
            + (" (a delete was under way in Blazar)" if status == "DELETING" else "")
        )
        return None

    def _event(self, row: Row, where: str) -> Event | None:
        try:
            kind = EventType(row["event_type"])
        except ValueError:
            self.report.unmappable.append(
                f"event {row['id']} of {where}: event type {row['event_type']!r} unknown"
            )
            return None
        status = str(row["status"])
        if status == EventStatus.IN_PROGRESS:
            # The Blazar manager stopped while running it: Climate's manager runs it again.
            self.report.notes.append(
                f"event {row['id']} ({kind}) of {where}: was IN_PROGRESS; it runs again"
            )
            status = EventStatus.UNDONE
        elif status not in EventStatus.__members__.values():
            self.report.unmappable.append(
                f"event {row['id']} of {where}: status {status!r} unknown"
            )
            return None
        odd = row["time"]
        if odd is None or isinstance(odd, Unreadable):  # a nullable column in Blazar
            why = "it has no time" if odd is None else f"time {odd.text!r} is not a date"
            self.report.unmappable.append(f"event {row['id']} ({kind}) of {where}: {why}")
            return None
        when = utc(odd)
        assert when is not None
        created, updated = self._stamps(row, f"event {row['id']} ({kind}) of {where}")
        return Event(
            id=row["id"],
            event_type=kind,
            time=when,
            not_before=when,
            priority=EVENT_ORDER[kind],
            seq=LIFECYCLE_ORDER[kind],
            status=status,
            attempts=0,
            last_error=None,
            claimed_by=None,
            claimed_until=None,
            done_at=(updated or when) if status == EventStatus.DONE else None,
            created_at=created,
            updated_at=updated,
        )

    def _reservation(
        self,
        lease: Lease,
        row: Row,
        details: Mapping[str, Mapping[str, Row]],
        host_allocations: Mapping[str, Sequence[Row]],
        fip_allocations: Mapping[str, Sequence[Row]],
        required: Mapping[str, Sequence[Row]],
    ) -> Reservation | None:
        rid, rtype = row["id"], row["resource_type"]
        where = f"reservation {rid}"
        resource_type = self.ctx.resource_types.get(rtype)
        detail_table = {
            HOSTS: "computehost_reservations",
            INSTANCES: "instance_reservations",
            FLOATING: "floatingip_reservations",
        }.get(rtype)
        if resource_type is None or detail_table is None:
            self.report.unmappable.append(f"{where}: resource type {rtype!r} unknown")
            return None
        detail = details[detail_table].get(rid)
        if detail is None:
            self.report.unmappable.append(f"{where}: no row in Blazar's {detail_table}")
            return None
        raw, extra = raw_params(rtype, detail, required)
        try:
            params = resource_type.validate(raw, None, where)
        except InvalidInput as exc:
            self.report.unmappable.append(exc.message)
            return None
        params.update(extra)
        status = str(row["status"])
        if status not in ReservationStatus.__members__.values():
            self.report.unmappable.append(f"{where}: status {status!r} unknown")
            return None
        created, updated = self._stamps(row, f"{where} of lease {lease.id} ({lease.name})")
        reservation = Reservation(
            id=rid,
            lease_id=lease.id,
            resource_type=rtype,
            resource_id=row["resource_id"] or detail["id"],
            status=status,
            missing_resources=bool(row.get("missing_resources")),
            resources_changed=bool(row.get("resources_changed")),
            params=params,
            created_at=created,
            updated_at=updated,
        )
        window = {
            "reservation_id": rid,
            "lease_id": lease.id,
            "start_date": lease.start_date,
            "end_date": lease.end_date,
        }
        allocated = host_allocations.get(rid, [])
        held = [a["compute_host_id"] for a in allocated if a["compute_host_id"] in self.host_ids]
        lost = sorted({a["compute_host_id"] for a in allocated} - set(self.host_ids))
        if lost:
            # Blazar's own answer to a host gone from under a reservation.
            reservation.missing_resources = True
            lease.degraded = True
            names = ", ".join(repr(self.host_names.get(h, h)) for h in lost)
            self.report.unmappable.append(
                f"{where} of lease {lease.id} ({lease.name}): holds host {names}, left out "
                "(the reservation is imported with missing_resources)"
            )
        if rtype == HOSTS:
            reservation.allocations = [
                HostAllocation(host_id=self.host_ids[h], **window) for h in sorted(set(held))
            ]
        elif rtype == INSTANCES:
            per_host = Counter(self.host_ids[h] for h in held)
            reservation.instance_allocations = [
                InstanceAllocation(
                    host_id=host_id,
                    count=count,
                    vcpus=params["vcpus"] * count,
                    memory_mb=params["memory_mb"] * count,
                    disk_gb=params["disk_gb"] * count,
                    **window,
                )
                for host_id, count in sorted(per_host.items())
            ]
        else:
            fips = [a["floatingip_id"] for a in fip_allocations.get(rid, [])]
            missing = sorted(f for f in fips if f not in self.item_ids)
            if missing:
                self.report.unmappable.append(f"{where}: floating IP {missing[0]} unknown")
                return None
            reservation.item_allocations = [
                ItemAllocation(item_id=self.item_ids[f], **window) for f in sorted(set(fips))
            ]
        return reservation

    def _stamps(self, row: Row, where: str) -> tuple[dt.datetime, dt.datetime | None]:
        """A row's ``created_at`` (the import's time when it has none) and ``updated_at``. One
        that is not a date is noted and read as none: a stamp, not worth leaving a row out."""
        stamps = []
        for column in ("created_at", "updated_at"):
            value = row.get(column)
            if isinstance(value, Unreadable):
                taken = "the import's time" if column == "created_at" else "none"
                self.report.notes.append(
                    f"{where}: {column} {value.text!r} is not a date; taken as {taken}"
                )
                value = None
            stamps.append(utc(value))
        return stamps[0] or self.now, stamps[1]
