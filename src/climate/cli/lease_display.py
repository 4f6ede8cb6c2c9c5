"""Leases for people: a lease with its reservations named, and a refusal's counter-offers."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from climate.cli.output import (
    describe_reservation,
    emit,
    pooled_name,
    printable,
    record,
    show_date,
    table,
)
from climate.cli.reservation_args import reservation_options

if TYPE_CHECKING:
    from climate.cli.http import ApiClient

LABELS: dict[str, tuple[str, str, str, str | None]] = {
    "physical:host": ("os-hosts", "host", "hypervisor_hostname", None),
    "virtual:instance": ("os-hosts", "host", "hypervisor_hostname", None),
    "device": ("devices", "device", "name", None),
    "network": ("networks", "network", "segment_id", "physical_network"),
    "virtual:floatingip": ("floatingips", "floatingip", "floating_ip_address", None),
    "virtual:volume": ("volume-pools", "volume_pool", "name", None),
}
"""Per resource type: the inventory path, its object's key, the field that names one and the
field of the pool its name is unique within (``output.pooled_name``)."""


class Labels:
    """Names of the resources a lease holds (a host's name, a floating IP's address...), read
    from the inventories; the id stands when the caller may not read one."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.found: dict[tuple[str, str], str] = {}
        self.refused: set[str] = set()

    def __call__(self, resource_type: str, resource_id: str) -> str:
        known = LABELS.get(resource_type)
        if known is None:
            return resource_id
        path, key, field, pool = known
        if (path, resource_id) not in self.found:
            status, answer = 403, None
            if path not in self.refused:
                status, answer = self.api.lookup(f"/{path}/{resource_id}")
            if status in (0, 401, 403):
                self.refused.add(path)  # asking for the others would be refused too
            value = pooled_name((answer or {}).get(key, {}), field, pool)
            self.found[(path, resource_id)] = resource_id if value is None else value
        return self.found[(path, resource_id)]


def show_lease(args: argparse.Namespace, api: ApiClient, lease: dict[str, Any]) -> None:
    """A lease for people: its fields, then one line per reservation (what it asks for and
    what it holds, named) and per event."""
    if emit(args, lease):
        return
    print(record({k: v for k, v in lease.items() if k not in ("reservations", "events")}))
    labels = Labels(api)
    reservations = [describe_reservation(r, labels) for r in lease["reservations"]]
    print(table(reservations, ["id", "type", "status", "asks", "holds"]))
    events = sorted(lease["events"], key=lambda e: e["time"])
    print(table(events, ["event_type", "time", "status", "last_error"]))


def counter_offers(error: dict[str, Any]) -> str:
    """A refusal's counter-offers, one line each, as options of the command refused: what a
    creation's offer asks for, or what an update's offer changes (its dates, its amounts)."""
    lines = []
    for offer in error.get("offers") or []:
        lease = offer["lease"]
        parts = [
            f"--{option} '{show_date(lease[key])}'"
            for option, key in (("start", "start_date"), ("end", "end_date"))
            if key in lease
        ]
        reservations = lease.get("reservations") or []
        if all("resource_type" in r for r in reservations):
            parts.append(reservation_options(reservations))
        else:  # an update's: the reservations it changes, by id
            parts += [f"reservation {r.get('id')}: {json.dumps(r)}" for r in reservations]
        below = " (less than asked)" if offer["below_request"] else ""
        lines.append(printable(f"  {offer['kind']}: {' '.join(p for p in parts if p)}{below}"))
    if not lines:
        return ""
    return (
        "\nthese would fit (each is also the request's body, in the API's answer):\n"
        + "\n".join(lines)
    )
