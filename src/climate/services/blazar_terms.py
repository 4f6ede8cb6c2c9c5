"""Blazar's terms as the import reads them (resource types, statuses, host columns), the rows
it groups, and the report of what was mapped and what could not be."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from climate.db.blazar_import import Row
from climate.domain.status import (
    LeaseStatus,
)

HOSTS = "physical:host"


INSTANCES = "virtual:instance"


FLOATING = "virtual:floatingip"
FLOATING_KIND = "floatingip"
"""The ``items.kind`` of the floating IPs the import adds (the ``virtual:floatingip`` type's)."""


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
        out = [f"{verb}: " + (counts(self.written) or "nothing")]
        if self.already:
            out.append("already in Climate (left as they are): " + counts(self.already))
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


def counts(counter: Counter[str]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counter.items() if n)


def raw_params(
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


def by(rows: Iterable[Row], key: str) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row[key]].append(row)
    return grouped


def digits(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())
