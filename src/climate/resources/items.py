"""Whole items reserved exclusively over time: devices, network segments, floating IPs, and
any item type a plugin adds.

Each kind is a row type of the one ``items`` table (``db/items.py``) with its own in-memory
calendar over ``item_allocations`` and its own inventory cache; choosing among free items is the
hosts' best fit (``planner.hosts.choose_hosts`` works on any integer ids). An ``ItemType``
subclass with its ``Kind``, registered in the ``climate.resources`` entry points, gets its
inventory routes, its services and its place in the document from the API (``item_kinds``).
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate import inputs
from climate.db import items as item_rows
from climate.db.calendar_cache import CalendarCache
from climate.db.tables import PROPERTY_VALUE_LENGTH, Reservation
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity
from climate.planner.availability import HostPlacer, HostRequest, SearchRange
from climate.planner.calendar import HostSet
from climate.planner.hosts import HostDemand, HostsView, choose_hosts
from climate.resources.base import (
    COUNT_TOO_SMALL,
    INVALID_RANGE,
    POLICY_FIELDS,
    ResourceType,
    before_end_field,
    in_request,
    int_field,
    merged_fields,
    policy_fields,
    query_field,
    text_field,
)
from climate.resources.capabilities import Items
from climate.resources.item_inventory import ItemInventory
from climate.resources.kinds import Kind
from climate.resources.wire_fields import (
    COUNT,
    INTEGER_STRING,
    POSITIVE,
    QUERY,
    STRING,
    Schema,
    WireFields,
)

MAX_SEGMENT_ID = 2**24 - 1
"""The largest VXLAN network identifier (VLAN ids stop at 4094)."""
MAX_REQUIRED = 1000


def _address(field_name: str, value: object) -> str:
    try:
        return str(ipaddress.ip_address(str(value).strip()))
    except ValueError:
        raise InvalidInput(
            field_name, f"IP address {value} is invalid form. (must be an IP address)"
        ) from None


def _segment(field_name: str, value: object) -> str:
    if isinstance(value, str) and not value.strip().isdigit():
        raise InvalidInput(field_name, f"must be an integer from 1 to {MAX_SEGMENT_ID}")
    return str(inputs.integer(field_name, value, minimum=1, maximum=MAX_SEGMENT_ID))


NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 255}
PROPERTY: Schema = {"type": "string", "maxLength": PROPERTY_VALUE_LENGTH}
DEVICES = Kind(
    kind="device",
    resource_type="device",
    singular="device",
    plural="devices",
    path="devices",
    key="device",
    model="Device",
    rules="blazar:devices",
    name_field="name",
    check_name=text_field,
    fields={"name": NAME},
    example={"name": "gpu-0", "model": "a100"},
)
NETWORKS = Kind(
    kind="network",
    resource_type="network",
    singular="network segment",
    plural="network segments",
    path="networks",
    key="network",
    model="Network",
    rules="blazar:networks",
    name_field="segment_id",
    check_name=_segment,
    fields={
        "segment_id": {
            "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_SEGMENT_ID}, INTEGER_STRING]
        },
        "physical_network": {"type": "string", "maxLength": 255},
        "network_type": STRING,
    },
    example={"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100},
    pool_field="physical_network",
    required=("network_type",),
)
FLOATING_IPS = Kind(
    kind="floatingip",
    resource_type="virtual:floatingip",
    singular="floating IP",
    plural="floating IPs",
    path="floatingips",
    key="floatingip",
    model="FloatingIP",
    rules="blazar:floatingips",
    name_field="floating_ip_address",
    held="Can't delete floating IP {id}. Floating IP id {id} is allocated by reservations.",
    shrunk="Floating IP reservation cannot be updated with requested parameters. Cannot remove "
    "allocations from an active reservation",
    check_name=_address,
    fields={
        "floating_network_id": NAME,
        "floating_ip_address": {"type": "string", "description": "an IPv4 or IPv6 address"},
        "subnet_id": PROPERTY,
    },
    example={
        "floating_network_id": "1e17587e-a7ed-4b82-a17b-4beb32523e28",
        "floating_ip_address": "172.24.4.101",
    },
    pool_field="floating_network_id",
    pool_required=True,
    shown=("subnet_id",),
)


@dataclass(frozen=True)
class ItemDemand:
    """What a reservation asks of one kind: ``min``..``max`` of ``candidates``, among them
    every one of ``required``."""

    candidates: HostSet
    min: int
    max: int
    required: frozenset[int] = frozenset()
    where: str = ""
    """Words naming the candidates in a refusal, e.g. "in network net-1"."""


class ItemType(ResourceType, Items):
    """A resource type over one kind of item; subclasses say what a request means."""

    def __init__(self) -> None:
        self.inventory = ItemInventory(self.kind.kind, self.kind.queryable)
        self.calendar = CalendarCache(item_rows.ItemAllocations(self.kind.kind))

    @abc.abstractmethod
    def demand(self, session: Session, params: Mapping[str, Any]) -> ItemDemand:
        """The candidates and counts for validated ``params``.

        :raises InvalidInput: a field names something that does not exist (a pool, an item).
        """

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
        wanted = self.demand(session, reservation.params)
        held = frozenset(a.item_id for a in reservation.item_allocations)
        must_keep = (held if active else frozenset()) | wanted.required
        if len(must_keep) > wanted.max:
            detail = (
                f"the lease is active on {len(must_keep)} {self.kind.plural}; the reservation "
                f"cannot drop below that ({wanted.max} asked)"
            )
            if self.kind.shrunk:
                raise InvalidInput("amount", f"{self.kind.shrunk} ({detail})")
            raise Conflict(detail)
        view = self.calendar.view(session, wanted.candidates, start, end, [reservation.id])
        self._check(view, wanted, must_keep, start, end)
        demand = HostDemand(start, end, wanted.min, wanted.max, held | must_keep, must_keep)
        chosen = choose_hosts(demand, view)
        allocations = self.calendar.replace(
            session, reservation.id, reservation.lease_id, chosen, start, end, fresh=not held
        )
        # The reservation may not be in the session (a new lease is written with Core inserts).
        set_committed_value(reservation, "item_allocations", allocations)

    def _check(
        self,
        view: HostsView,
        wanted: ItemDemand,
        must_keep: frozenset[int],
        start: dt.datetime,
        end: dt.datetime,
    ) -> None:
        """Refuse, in this kind's words, what ``choose_hosts`` would refuse in a host's."""
        window = f"{start.isoformat()} to {end.isoformat()}"
        position = {int(i): k for k, i in enumerate(view.ids.tolist())}
        blocked = sorted(
            view.names[position[i]] if i in position else str(i)
            for i in must_keep
            if i not in position or not view.free[position[i]]
        )
        if blocked:
            raise NotEnoughCapacity(
                f"{self.kind.singular}(s) {', '.join(blocked)} not free (or no longer reservable) "
                f"for the whole window {window}"
            )
        free = int(np.count_nonzero(view.free))
        if free < wanted.min:
            where = f" {wanted.where}" if wanted.where else ""
            raise NotEnoughCapacity(
                f"Not enough {self.kind.plural} available{where}: {wanted.min} requested, "
                f"{len(view)} match, {free} free for the whole window {window}"
            )

    @contextlib.contextmanager
    def searching(
        self,
        session: Session,
        reservations: Sequence[tuple[int, Mapping[str, Any]]],
        search: SearchRange,
    ) -> Iterator[HostPlacer]:
        """An availability search for validated reservations (position in the request,
        parameters), over the calendar as committed, held still until the search is done.

        :raises InvalidInput: a reservation names what does not exist (``reservations[i]....``).
        """
        with self.calendar.reading(session) as calendar:
            requests = []
            for index, params in reservations:
                try:
                    wanted = self.demand(session, params)
                except InvalidInput as bad:
                    raise in_request(index, bad) from None
                requests.append(
                    HostRequest(
                        index,
                        wanted.candidates,
                        wanted.min,
                        wanted.max,
                        wanted.required,
                        reducible="min" in params,
                    )
                )
            yield HostPlacer(calendar, requests, search)

    def release(self, session: Session, reservation: Reservation, at: dt.datetime) -> None:
        if all(a.end_date <= at for a in reservation.item_allocations):
            return
        self.calendar.truncate(session, reservation.id, at)
        session.refresh(reservation, ["item_allocations"])

    def resource_ids(self, reservation: Reservation) -> list[str]:
        return [str(a.item_id) for a in reservation.item_allocations]


class DeviceType(ItemType):
    """``device``: ``min``..``max`` devices matching ``resource_properties``."""

    name = "device"
    kind = DEVICES
    wire = WireFields(
        model="Device",
        asked={"min": COUNT, "max": COUNT, "resource_properties": QUERY},
        shown={"min": POSITIVE, "max": POSITIVE, "resource_properties": STRING},
        required=("min", "max"),
    )
    fields = frozenset({"min", "max", "resource_properties", "before_end"}) | POLICY_FIELDS

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        merged = merged_fields(self, raw, current)
        minimum = int_field(merged, "min", field, minimum=1, too_small=COUNT_TOO_SMALL)
        maximum = int_field(merged, "max", field, minimum=1, too_small=COUNT_TOO_SMALL)
        if maximum < minimum:
            raise InvalidInput(f"{field}.max", f"{INVALID_RANGE} (min {minimum}, max {maximum})")
        return {
            "min": minimum,
            "max": maximum,
            "resource_properties": query_field(merged, "resource_properties", field),
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
        }

    def demand(self, session: Session, params: Mapping[str, Any]) -> ItemDemand:
        matching = self.inventory.matching(session, params["resource_properties"])
        return ItemDemand(matching, params["min"], params["max"])


class NetworkType(ItemType):
    """``network``: ``amount`` segments matching ``network_properties`` and
    ``resource_properties`` (both queries over the segment's fields and extra properties)."""

    name = "network"
    kind = NETWORKS
    wire = WireFields(
        model="Network",
        asked={"amount": COUNT, "network_properties": QUERY, "resource_properties": QUERY},
        shown={"amount": POSITIVE, "network_properties": STRING, "resource_properties": STRING},
    )
    fields = (
        frozenset({"amount", "network_properties", "resource_properties", "before_end"})
        | POLICY_FIELDS
    )

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        merged = merged_fields(self, raw, current)
        merged.setdefault("amount", 1)
        return {
            "amount": int_field(merged, "amount", field, minimum=1),
            "network_properties": query_field(merged, "network_properties", field),
            "resource_properties": query_field(merged, "resource_properties", field),
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
        }

    def demand(self, session: Session, params: Mapping[str, Any]) -> ItemDemand:
        matching = self.inventory.matching(
            session, params["network_properties"], params["resource_properties"]
        )
        return ItemDemand(matching, params["amount"], params["amount"])


class FloatingIPType(ItemType):
    """``virtual:floatingip``: ``amount`` addresses of network ``network_id``, among them every
    address of ``required_floatingips``."""

    name = "virtual:floatingip"
    kind = FLOATING_IPS
    wire = WireFields(
        model="FloatingIP",
        asked={
            "network_id": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
            "amount": COUNT,
            "required_floatingips": {
                "type": "array",
                "maxItems": MAX_REQUIRED,
                "uniqueItems": True,
                "items": STRING,
                "description": "addresses of the network that must be among those reserved",
            },
        },
        shown={
            "network_id": STRING,
            "amount": POSITIVE,
            "required_floatingips": {"type": "array", "items": STRING},
        },
        required=("network_id",),
    )
    fields = (
        frozenset({"network_id", "amount", "required_floatingips", "before_end"}) | POLICY_FIELDS
    )

    def validate(
        self, raw: Mapping[str, Any], current: Mapping[str, Any] | None, field: str
    ) -> dict[str, Any]:
        if current is not None:
            _check_kept(raw, current, field)
        merged = merged_fields(self, raw, current)
        merged.setdefault("amount", 1)
        if merged.get("network_id") is None:
            raise InvalidInput(
                f"{field}.network_id", "Missing parameter network_id (the floating IPs' network)"
            )
        network = text_field(f"{field}.network_id", merged["network_id"])
        amount = int_field(merged, "amount", field, minimum=1)
        required = merged.get("required_floatingips") or []
        where = f"{field}.required_floatingips"
        if isinstance(required, str):
            required = [required]
        if not isinstance(required, list) or len(required) > MAX_REQUIRED:
            raise InvalidInput(where, f"must be a list of at most {MAX_REQUIRED} IP addresses")
        addresses = [_address(where, a) for a in required]
        duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
        if duplicates:
            raise InvalidInput(where, f"lists {', '.join(duplicates)} more than once")
        if len(addresses) > amount:
            raise InvalidInput(
                where,
                "Invalid values for required_floatingips and amount. The amount must be equal to "
                f"or longer than length of required_floatingips. ({len(addresses)} addresses, "
                f"amount {amount})",
            )
        return {
            "network_id": network,
            "amount": amount,
            "required_floatingips": addresses,
            "before_end": before_end_field(self.before_end_actions, merged, field),
            **policy_fields(self, merged, field),
        }

    def demand(self, session: Session, params: Mapping[str, Any]) -> ItemDemand:
        network = params["network_id"]
        pool = self.inventory.matching(session, pool=network)
        if not pool.names:
            raise InvalidInput(
                "network_id", f"no reservable floating IPs are registered in network {network}"
            )
        by_address = dict(zip(pool.names, pool.ids.tolist(), strict=True))
        outside = [a for a in params["required_floatingips"] if a not in by_address]
        if outside:
            raise InvalidInput(
                "required_floatingips",
                f"Not enough floating IPs available: {', '.join(outside)} not among the "
                f"reservable floating IPs of network {network}",
            )
        required = frozenset(int(by_address[a]) for a in params["required_floatingips"])
        return ItemDemand(
            pool, params["amount"], params["amount"], required, f"in network {network}"
        )


CANT_UPDATE = "Floating IP reservation cannot be updated with requested parameters."


def _check_kept(raw: Mapping[str, Any], current: Mapping[str, Any], field: str) -> None:
    """As Blazar: an existing floating-IP reservation keeps its network, and its required
    addresses unless they are given again or emptied."""
    if "network_id" in raw and str(raw["network_id"]) != current["network_id"]:
        raise InvalidInput(
            f"{field}.network_id", f"{CANT_UPDATE} Updating network_id is not supported"
        )
    required = raw.get("required_floatingips")
    if "required_floatingips" in raw and required not in ([], current["required_floatingips"]):
        raise InvalidInput(
            f"{field}.required_floatingips",
            f"{CANT_UPDATE} Updating required_floatingips is not supported except with an "
            "empty list",
        )
