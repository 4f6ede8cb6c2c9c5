"""Moving from Blazar: a Blazar database's leases, hosts and floating IPs into Climate.

One transaction under the admission lock: everything is written or nothing. Blazar's lease,
reservation and event ids are kept (a host reservation's aggregate and an instance
reservation's flavor are named by the reservation id), and so is a host's id when it is a
number. What cannot be mapped is named in the report; the import refuses to run past it
unless told to leave it out. Running it again writes only what is not there yet.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from climate.backends.base import Enrol, Timeboxed, UnknownResource
from climate.context import ServiceContext
from climate.db import audit as audit_rows
from climate.db import blazar_import as blazar_rows
from climate.db.blazar_import import BlazarRows, Present, Row, utc
from climate.db.engine import ADMISSION_LOCK
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
from climate.errors import BackendError, ClimateError, InvalidInput
from climate.resources.items import FLOATING_IPS

HOSTS = "physical:host"
INSTANCES = "virtual:instance"
FLOATING = "virtual:floatingip"
SAME_STATUS = frozenset(
    {
        LeaseStatus.PENDING,
        LeaseStatus.ACTIVE,
        LeaseStatus.TERMINATED,
        LeaseStatus.ERROR,
        LeaseStatus.STARTING,
        LeaseStatus.TERMINATING,
    }
)
DERIVED_STATUS = frozenset({"CREATING", "UPDATING"})
"""Blazar's transitional statuses left by a manager stopped mid-change: the lease is what its
events say (started or not)."""
HOST_COLUMNS = (
    "service_name",
    "hypervisor_type",
    "hypervisor_version",
    "vcpus",
    "memory_mb",
    "local_gb",
    "cpu_info",
    "status",
    "trust_id",
)
KEPT_AS_PROPERTY = ("availability_zone",)
"""Blazar host columns Climate has no column for: kept as properties, shown the same way."""


class Unmappable(ClimateError):
    """The Blazar database has rows Climate cannot map; nothing was written."""

    status = 409
    name = "UNMAPPABLE"


@dataclass
class ImportReport:
    """What an import wrote (or, dry, would write), what was there already, what it cannot
    map (by name), and notes on what changed on the way (renumbered hosts, reset events)."""

    dry_run: bool
    written: Counter[str] = field(default_factory=Counter)
    already: Counter[str] = field(default_factory=Counter)
    unmappable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: bool = False
    """The unmappable rows were left out (``--skip-unmappable``)."""

    def lines(self) -> list[str]:
        verb = "would write" if self.dry_run else "wrote"
        out = [f"{verb}: " + (_counts(self.written) or "nothing")]
        if self.already:
            out.append("already in Climate (left as they are): " + _counts(self.already))
        if self.unmappable:
            left = "left out" if self.skipped else "cannot map"
            out.append(f"{left} ({len(self.unmappable)}):")
            out.extend(f"  {u}" for u in self.unmappable)
        out.extend(f"note: {n}" for n in self.notes)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "written": dict(self.written),
            "already": dict(self.already),
            "unmappable": self.unmappable,
            "skipped_unmappable": self.skipped,
            "notes": self.notes,
        }


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counter.items() if n)


class BlazarImportService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed | None = None) -> None:
        self.ctx = ctx
        self.backend = backend
        """Asked about each host (``Enrol``): one the cloud no longer knows is unmappable."""

    def run(self, url: str, *, dry_run: bool, skip_unmappable: bool = False) -> ImportReport:
        """Import the Blazar database at ``url``; ``dry_run``: report, write nothing.

        :raises Unmappable: some rows cannot be mapped and ``skip_unmappable`` is not set
            (nothing is written; the message names every one).
        :raises InvalidInput: ``url`` is not a readable Blazar database.
        """
        source = blazar_rows.read(url)
        unknown_hosts = self._unknown_hosts(source)
        report = ImportReport(dry_run=dry_run)
        with self.ctx.db.transaction(lock=ADMISSION_LOCK, rollback=dry_run) as session:
            version = int(session.info["lock_version"])
            lease_ids = [r["id"] for r in source.of("leases")]
            mapping = _Mapping(
                self.ctx,
                source,
                blazar_rows.present(session, lease_ids, FLOATING_IPS.kind),
                unknown_hosts,
                report,
                self.ctx.clock.now(),
            )
            hosts, items, settings = mapping.inventory()
            blazar_rows.add_inventory(session, hosts, items, settings)
            leases, instance_hosts = mapping.leases()
            if report.unmappable and not skip_unmappable and not dry_run:
                raise Unmappable(
                    "the Blazar database has rows Climate cannot map (nothing was "
                    "written; --skip-unmappable imports without them): "
                    + "; ".join(report.unmappable)
                )
            report.skipped = bool(report.unmappable) and skip_unmappable
            blazar_rows.add_leases(session, leases, version, instance_hosts)
            if not dry_run and report.written:
                audit_rows.record(
                    session,
                    at=mapping.now,
                    actor="import-blazar",
                    action="blazar.import",
                    target_type="database",
                    target_id=_safe_url(url),
                    detail=report.as_dict(),
                )
        return report

    def _unknown_hosts(self, source: BlazarRows) -> dict[str, str]:
        """Blazar host names the cloud does not know, with why (asked outside any
        transaction: a slow cloud never holds the admission lock)."""
        if self.backend is None:
            return {}
        names = [h["hypervisor_hostname"] for h in source.of("computehosts")]
        names = [n for n in names if n]
        results = self.backend.handle([Enrol(HOSTS, n) for n in names])
        unknown = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, UnknownResource):
                unknown[name] = str(result)
            elif isinstance(result, BaseException):
                raise BackendError(
                    f"host {name!r}: backend {self.backend.name} could not say whether the "
                    f"cloud knows it: {result}"
                )
        return unknown


def _safe_url(url: str) -> str:
    """The URL without its password, for the audit log."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.partition(':')[0]}@{tail}"


class _Mapping:
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
        numbered = {int(h["id"]) for h in self.source.of("computehosts") if _digits(h["id"])}
        new: list[Host] = []
        for row in self.source.of("computehosts"):
            blazar_id, name = row["id"], row["hypervisor_hostname"]
            if not name:
                self.report.unmappable.append(f"host {blazar_id}: it has no hypervisor_hostname")
                continue
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
            host = Host(
                hypervisor_hostname=name,
                reservable=bool(row["reservable"]),
                created_at=utc(row["created_at"]) or self.now,
                updated_at=utc(row["updated_at"]),
            )
            for column in HOST_COLUMNS:
                setattr(host, column, row.get(column))
            if _digits(blazar_id) and int(blazar_id) not in taken:
                host.id = int(blazar_id)
                taken.add(host.id)
            else:
                why = "is not a number" if not _digits(blazar_id) else "is another host's"
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
            new.append(
                ResourceProperty(
                    id=row["id"],
                    resource_type=HOSTS,
                    property_name=row["property_name"],
                    private=bool(row["private"]),
                    created_at=utc(row["created_at"]) or self.now,
                    updated_at=utc(row["updated_at"]),
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
            item = Item(
                kind=FLOATING_IPS.kind,
                pool=key[0],
                name=key[1],
                reservable=bool(row["reservable"]),
                created_at=utc(row["created_at"]) or self.now,
                updated_at=utc(row["updated_at"]),
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
        reservations = _by(self.source.of("reservations"), "lease_id")
        events = _by(self.source.of("events"), "lease_id")
        details = {
            table: {r["reservation_id"]: r for r in self.source.of(table)}
            for table in (
                "computehost_reservations",
                "instance_reservations",
                "floatingip_reservations",
            )
        }
        host_allocations = _by(self.source.of("computehost_allocations"), "reservation_id")
        fip_allocations = _by(self.source.of("floatingip_allocations"), "reservation_id")
        required = _by(self.source.of("required_floatingips"), "floatingip_reservation_id")
        out: list[Lease] = []
        instance_hosts: set[int] = set()
        for row in self.source.of("leases"):
            if row["id"] in self.present.lease_ids:
                self.report.already["leases"] += 1
                continue
            lease = self._lease(row, events.get(row["id"], []))
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

    def _lease(self, row: Row, blazar_events: Sequence[Row]) -> Lease | None:
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
        start, end = utc(row["start_date"]), utc(row["end_date"])
        assert start is not None and end is not None  # NOT NULL in Blazar
        before_end = [e.time for e in events if e.event_type == EventType.BEFORE_END_LEASE]
        return Lease(
            id=row["id"],
            name=row["name"],
            project_id=row["project_id"] or "",
            user_id=row["user_id"] or "",
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
            created_at=utc(row["created_at"]) or self.now,
            updated_at=utc(row["updated_at"]),
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
        when = utc(row["time"])
        assert when is not None
        updated = utc(row["updated_at"])
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
            created_at=utc(row["created_at"]) or self.now,
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
        raw, extra = _raw_params(rtype, detail, required)
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
        reservation = Reservation(
            id=rid,
            lease_id=lease.id,
            resource_type=rtype,
            resource_id=row["resource_id"] or detail["id"],
            status=status,
            missing_resources=bool(row.get("missing_resources")),
            resources_changed=bool(row.get("resources_changed")),
            params=params,
            created_at=utc(row["created_at"]) or self.now,
            updated_at=utc(row["updated_at"]),
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


def _raw_params(
    rtype: str, detail: Row, required: Mapping[str, Sequence[Row]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A reservation's parameters as Blazar's API takes them (for the resource type to
    validate), and what Climate keeps beside them as they are."""
    if rtype == HOSTS:
        raw = {
            "count_range": detail["count_range"],
            "hypervisor_properties": detail["hypervisor_properties"] or "",
            "resource_properties": detail["resource_properties"] or "",
            "before_end": detail["before_end"] or "default",
        }
        return raw, {}
    if rtype == INSTANCES:
        raw = {key: detail[key] for key in ("amount", "vcpus", "memory_mb", "disk_gb", "affinity")}
        raw["resource_properties"] = detail["resource_properties"] or ""
        group = detail.get("server_group_id")
        return raw, ({"server_group_id": group} if group else {})
    raw = {
        "network_id": detail["network_id"],
        "amount": detail["amount"],
        "required_floatingips": [r["address"] for r in required.get(detail["id"], [])],
    }
    return raw, {}


def _by(rows: Iterable[Row], key: str) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row[key]].append(row)
    return grouped


def _digits(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())
