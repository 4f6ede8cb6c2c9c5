"""``virtual:instance``: ``amount`` instances of one size, packed onto hosts that share their
capacity over time (``planner/instances.py``).

A host's size is its ``vcpus``, ``memory_mb`` and ``local_gb`` (from host-create), times its
allocation ratios (extra properties ``cpu_allocation_ratio``, ``ram_allocation_ratio``,
``disk_allocation_ratio``, else the settings of the same names, 1.0 by default). Hosts without a
size are not candidates. A host reserved whole in a window holds no instances in it, and a host
with instances in a window is busy for whole-host requests in it: the whole-host calendar sees
each host's instance usage as busy spans (``CalendarCache.mark_stale`` keeps it in step).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate.config import Settings
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db.calendar_cache import CalendarCache
from climate.db.tables import Reservation
from climate.domain.status import EndPolicy
from climate.domain.views import ReservationView
from climate.errors import Conflict, InvalidInput
from climate.planner.calendar import HostSet, moment, seconds
from climate.planner.instances import (
    HostRoom,
    InstanceDemand,
    Size,
    Use,
    check_possible,
    place,
)
from climate.planner.query import parse_query
from climate.resources.base import (
    POLICY_FIELDS,
    ResourceType,
    before_end_field,
    changed_while_running,
    int_field,
    merged_fields,
    policy_fields,
    query_field,
)
from climate.resources.capabilities import SharedHosts
from climate.resources.hosts import Inventory, flag_field
from climate.resources.ratios import RATIOS, parse_ratio
from climate.resources.wire_fields import COUNT, POSITIVE, QUERY, STRING, WireFields, nullable

FIELDS = (
    frozenset(
        {"amount", "vcpus", "memory_mb", "disk_gb", "affinity", "resource_properties", "before_end"}
    )
    | POLICY_FIELDS
    | {"movable"}
)
SIZE_COLUMNS = ("vcpus", "memory_mb", "local_gb")
TRUE = frozenset({"true", "yes", "on", "1", "t", "y"})
FALSE = frozenset({"false", "no", "off", "0", "f", "n"})
NONE = frozenset({"None", "none"})
"""Blazar's ``NONE_VALUES`` (with None itself): no other spelling means no rule."""
SERVER_GROUPS = uuid.UUID("8d2c3c1e-5f0b-4b7e-9a59-2f6b8f5d7c01")


def affinity_field(merged: Mapping[str, Any], field: str) -> bool | None:
    """Blazar's ``affinity``: true, false or None (the blazar CLI sends "True", "False",
    "None")."""
    value = merged.get("affinity")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in NONE:
        return None
    # As oslo's bool_from_string, which Blazar uses: any case, and the integers 1 and 0.
    text = str(value).lower() if isinstance(value, str | int) else None
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise InvalidInput(
        f"{field}.affinity",
        f"Malformed parameter affinity (must be a bool value or None), not {value!r}",
    )


def enforcement(reservation: ReservationView) -> dict[str, Any]:
    """What a backend needs to enforce the reservation, as Blazar keeps it: a private flavor
    of the reserved size, an aggregate of the hosts it uses (with how many instances on each)
    and, with an affinity rule, a server group."""
    affinity = reservation.params.get("affinity")
    return {
        "flavor_id": reservation.id,
        "aggregate_id": reservation.id,
        # The cloud's own group once a backend made one (openstack), else a stable stand-in.
        "server_group_id": None
        if affinity is None
        else str(
            reservation.params.get("server_group_id") or uuid.uuid5(SERVER_GROUPS, reservation.id)
        ),
        "hosts": [
            {"host_id": str(host_id), "count": count}
            for host_id, count in held_to_the_end(reservation).items()
        ],
    }


def held_to_the_end(reservation: ReservationView) -> dict[int, int]:
    """Instances per host (by host id) the reservation holds to its end. Healing leaves a
    failed host the allocation of its past, which ends before the others, and adds the
    instances placed elsewhere as rows of their own (one more on a host it held already)."""
    rows = reservation.instance_allocations
    if not rows:
        return {}
    last = max(a.end_date for a in rows)
    counts: dict[int, int] = {}
    for a in rows:
        if a.end_date == last:
            counts[a.host_id] = counts.get(a.host_id, 0) + a.count
    return dict(sorted(counts.items()))


class InstanceType(ResourceType, SharedHosts):
    name = "virtual:instance"
    fields = FIELDS
    end_policies = frozenset(EndPolicy)
    acts_for_lessee = True
    wire = WireFields(
        model="Instance",
        asked={
            "amount": COUNT,
            "vcpus": COUNT,
            "memory_mb": COUNT,
            "disk_gb": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": "^[0-9]+$"},
                ]
            },
            "affinity": {
                "anyOf": [{"type": "boolean"}, {"type": "null"}, {"type": "string"}],
                "description": "true: all on one host; false: each on its own; null: anywhere "
                '(also "True", "False", "None")',
            },
            "resource_properties": QUERY,
        },
        shown={
            "amount": POSITIVE,
            "vcpus": POSITIVE,
            "memory_mb": POSITIVE,
            "disk_gb": {"type": "integer", "minimum": 0},
            "affinity": nullable({"type": "boolean"}),
            "resource_properties": STRING,
            "flavor_id": {"type": "string", "description": "the reservation's private flavor"},
            "aggregate_id": {"type": "string", "description": "the aggregate of its hosts"},
            "server_group_id": nullable({"type": "string", "format": "uuid"}),
            "hosts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "host_id": {"type": "string", "pattern": "^[0-9]+$"},
                        "count": POSITIVE,
                    },
                    "required": ["host_id", "count"],
                    "additionalProperties": False,
                },
            },
        },
        required=("amount", "vcpus", "memory_mb", "disk_gb"),
        counted=True,
    )

    def shown(self, reservation: ReservationView) -> dict[str, Any]:
        return enforcement(reservation)

    def __init__(self) -> None:
        self.inventory = Inventory()
        self.ratios: tuple[float, ...] = (1.0, 1.0, 1.0)
        self.calendar = CalendarCache()
        """The hosts' calendar, with their instance uses: the whole-host type's once
        ``load_resource_types`` has joined them."""

    def configure(self, settings: Settings) -> None:
        self.ratios = tuple(float(getattr(settings, r)) for r in RATIOS)

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        merged = merged_fields(self, raw, current)
        return {
            "amount": int_field(merged, "amount", field, minimum=1),
            "vcpus": int_field(merged, "vcpus", field, minimum=1),
            "memory_mb": int_field(merged, "memory_mb", field, minimum=1),
            "disk_gb": int_field(merged, "disk_gb", field, minimum=0),
            "affinity": affinity_field(merged, field),
            "resource_properties": query_field(merged, "resource_properties", field),
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
            # Movable (by a best-effort lease's reclaim) unless it says not; stored only then.
            **({} if flag_field(merged, "movable", field, default=True) else {"movable": False}),
        }

    def check_running_change(self, raw: Mapping[str, Any], field: str) -> None:
        """As Blazar: a running instance reservation takes a new amount, nothing else (its
        instances already run with their flavor, group and hosts); Climate's start and end
        policies may change too (docs/policies.md)."""
        other = sorted(set(self.known(raw)) - {"amount"} - POLICY_FIELDS)
        if other:
            raise Conflict(
                f"{field}.{other[0]}: An active reservation only accepts to update amount."
            )

    def admit(
        self,
        session: Session,
        reservation: Reservation,
        start: dt.datetime,
        end: dt.datetime,
        *,
        active: bool,
        now: dt.datetime | None = None,
    ) -> None:
        params = reservation.params
        size = Size(params["vcpus"], params["memory_mb"], params["disk_gb"])
        held = reservation.instance_allocations
        # Rows that ended before now are where instances ran before a reclaim moved them.
        running = [a for a in held if now is None or a.end_date > now]
        keep: dict[int, int] = {}
        for a in running if active else ():  # healing may add a row on a host it holds
            keep[a.host_id] = keep.get(a.host_id, 0) + a.count
        if keep and any(Size(a.vcpus, a.memory_mb, a.disk_gb) != size.times(a.count) for a in held):
            raise Conflict("vcpus: a running instance reservation changes only its amount")
        since = changed_while_running(active, now, start, end)
        hosts = self._hosts(session, params["resource_properties"])
        demand = InstanceDemand(
            since or start, end, params["amount"], size, params["affinity"], keep
        )
        check_possible(demand, hosts)
        rooms = self._rooms(session, hosts, reservation.id, since or start, end)
        placement = place(demand, rooms)
        before = {a.host_id for a in held}
        rows = instance_rows.replace(
            session,
            reservation.id,
            reservation.lease_id,
            placement,
            size.as_tuple(),
            start,
            end,
            since=since,
        )
        self.changed(session, before | set(placement))
        # The reservation may not be in the session (a new lease is written with Core inserts).
        set_committed_value(reservation, "instance_allocations", rows)

    def rooms(
        self, session: Session, reservation: Reservation, start: dt.datetime, end: dt.datetime
    ) -> list[HostRoom]:
        """Where the reservation's instances may run over [start, end): the reservable matching
        sized hosts not reserved whole then, with what other reservations use on them."""
        hosts = self.sized_hosts(session, reservation.params["resource_properties"])
        return self._rooms(session, hosts, reservation.id, start, end)

    def _rooms(
        self,
        session: Session,
        hosts: list[HostRoom],
        reservation_id: str,
        start: dt.datetime,
        end: dt.datetime,
    ) -> list[HostRoom]:
        calendar = self.calendar.synced(session)
        whole = {
            k
            for k, owner in calendar.owners_within(
                HostSet((h.id, h.name) for h in hosts), seconds(start), seconds(end)
            )
            if instance_rows.host_of_owner(owner) is None
        }
        free = [h for k, h in enumerate(hosts) if k not in whole]
        around = host_rows.LOOKAROUND.total_seconds()
        found = self.calendar.uses.within(
            [h.id for h in free], seconds(start) - around, seconds(end) + around, reservation_id
        )
        uses: dict[int, list[Use]] = {}
        rows = zip(
            found.position.tolist(),
            found.starts.tolist(),
            found.ends.tolist(),
            found.sizes.tolist(),
            strict=True,
        )
        for k, s, e, (vcpus, memory_mb, disk_gb) in rows:
            uses.setdefault(k, []).append((moment(s), moment(e), Size(vcpus, memory_mb, disk_gb)))
        return [HostRoom(h.id, h.name, h.capacity, uses.get(k, ())) for k, h in enumerate(free)]

    def _hosts(self, session: Session, resource_properties: str) -> list[HostRoom]:
        """Reservable hosts matching the query that have a size, scaled by their ratios; kept
        per query until the inventory changes (every instance admission asks).

        :raises InvalidInput: hosts match but none has a size (naming the missing column).
        """
        # Keyed by the ratios too: they scale the sizes.
        key = ("sized", resource_properties, self.ratios)
        found = self.inventory.derived(
            session, key, lambda records: self._sizes(records, resource_properties)
        )
        if isinstance(found, tuple):
            raise InvalidInput(*found)
        return list(found)

    def _sizes(
        self, records: Sequence[host_rows.HostRecord], resource_properties: str
    ) -> list[HostRoom] | tuple[str, str]:
        query = parse_query("resource_properties", resource_properties)
        matching = [r for r in records if query.matches(r.properties)]
        rooms = []
        for record in matching:
            values = [record.properties.get(c) for c in SIZE_COLUMNS]
            if any(v is None for v in values):
                continue
            scaled = [
                math.floor(int(str(v)) * self._ratio(record, k) + 1e-9)
                for k, v in enumerate(values)
            ]
            rooms.append(HostRoom(record.id, record.hypervisor_hostname, Size(*scaled)))
        if matching and not rooms:
            missing = next(
                c for c in SIZE_COLUMNS if any(r.properties.get(c) is None for r in matching)
            )
            return (
                f"hosts.{missing}",
                f"{len(matching)} host(s) match the properties but none has its size "
                "(vcpus, memory_mb, local_gb) registered; set it with host-create or host-update",
            )
        return rooms

    def _ratio(self, record: host_rows.HostRecord, k: int) -> float:
        own = record.properties.get(RATIOS[k])
        return self.ratios[k] if own is None else parse_ratio(RATIOS[k], own)

    @staticmethod
    def changed(session: Session, host_ids: set[int]) -> None:
        """The whole-host calendar's view of these hosts' instance usage is stale."""
        if host_ids:
            owners = [instance_rows.usage_owner(h) for h in sorted(host_ids)]
            CalendarCache.mark_stale(session, "hosts", owners)

    def release(self, session: Session, reservation: Reservation, at: dt.datetime) -> None:
        if all(a.end_date <= at for a in reservation.instance_allocations):
            return
        instance_rows.truncate(session, reservation.id, at)
        self.changed(session, {a.host_id for a in reservation.instance_allocations})
        session.refresh(reservation, ["instance_allocations"])

    def resource_ids(self, reservation: Reservation) -> list[str]:
        """One id per instance slot it holds to its end: the host's id and the slot's number
        on it."""
        return [
            f"{host_id}:{n}"
            for host_id, count in held_to_the_end(reservation).items()
            for n in range(count)
        ]

    def sized_hosts(self, session: Session, resource_properties: str) -> list[HostRoom]:
        """Where instances asking for ``resource_properties`` may run: the reservable matching
        hosts that have a size, scaled by their ratios (a reclaim moves instances among them)."""
        try:
            return self._hosts(session, resource_properties)
        except InvalidInput:
            return []  # hosts match, but none has a size
