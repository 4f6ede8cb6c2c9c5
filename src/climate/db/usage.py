"""What a project holds over a time range, for usage rules (fairshare/): one indexed range scan
per allocation table a rule counts, bounded by the leases' windows (``ix_leases_project_end``),
never a walk through the project's history."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from climate.db.tables import (
    Host,
    HostAllocation,
    HostProperty,
    InstanceAllocation,
    Item,
    ItemAllocation,
    ItemProperty,
    Lease,
    VolumeAllocation,
    VolumePool,
    VolumePoolProperty,
)

HOST_FACTS = ("hypervisor_hostname", "hypervisor_type", "vcpus", "memory_mb", "local_gb")
"""Host columns a rule's properties may name, beside the extra properties."""
FLOATING_IP = "floatingip"


@dataclass(frozen=True)
class Held:
    """One allocation row of the project: ``what`` is a host, item or pool id."""

    resource_type: str
    lease_id: str
    user_id: str
    what: int
    start: dt.datetime
    end: dt.datetime
    vcpus: int = 0
    gb: int = 0


def _window(project_id: str, low: dt.datetime, high: dt.datetime) -> list[Any]:
    return [Lease.project_id == project_id, Lease.end_date > low, Lease.start_date < high]


def held(
    session: Session,
    project_id: str,
    low: dt.datetime,
    high: dt.datetime,
    resource_types: Collection[str],
) -> list[Held]:
    """Every allocation of ``project_id``'s leases (deleted ones too: what they held until
    then was used) of ``resource_types`` overlapping [low, high)."""
    found: list[Held] = []
    leases = _window(project_id, low, high)
    if "physical:host" in resource_types:
        a = HostAllocation
        rows = session.execute(
            select(a.lease_id, Lease.user_id, a.host_id, a.start_date, a.end_date)
            .join(Lease, Lease.id == a.lease_id)
            .where(*leases, a.end_date > low, a.start_date < high)
        )
        found.extend(Held("physical:host", *row) for row in rows)
    if "virtual:instance" in resource_types:
        i = InstanceAllocation
        rows = session.execute(
            select(i.lease_id, Lease.user_id, i.host_id, i.start_date, i.end_date, i.vcpus)
            .join(Lease, Lease.id == i.lease_id)
            .where(*leases, i.end_date > low, i.start_date < high)
        )
        found.extend(Held("virtual:instance", *row) for row in rows)
    if "virtual:floatingip" in resource_types:
        t = ItemAllocation
        rows = session.execute(
            select(t.lease_id, Lease.user_id, t.item_id, t.start_date, t.end_date)
            .join(Lease, Lease.id == t.lease_id)
            .join(Item, Item.id == t.item_id)
            .where(*leases, Item.kind == FLOATING_IP, t.end_date > low, t.start_date < high)
        )
        found.extend(Held("virtual:floatingip", *row) for row in rows)
    if "virtual:volume" in resource_types:
        v = VolumeAllocation
        volumes = session.execute(
            select(v.lease_id, Lease.user_id, v.pool_id, v.start_date, v.end_date, v.size_gb)
            .join(Lease, Lease.id == v.lease_id)
            .where(*leases, v.end_date > low, v.start_date < high)
        )
        found.extend(
            Held("virtual:volume", lease, user, pool, start, end, gb=size)
            for lease, user, pool, start, end, size in volumes
        )
    return found


def host_facts(session: Session) -> dict[int, dict[str, Any]]:
    """Every host (reservable or not) with ``HOST_FACTS`` and its extra properties."""
    columns = [getattr(Host, c) for c in HOST_FACTS]
    facts = {
        row[0]: dict(zip(HOST_FACTS, row[1:], strict=True))
        for row in session.execute(select(Host.id, *columns))
    }
    for host_id, name, value in session.execute(
        select(HostProperty.host_id, HostProperty.name, HostProperty.value)
    ):
        facts[host_id][name] = value
    return facts


def item_properties(session: Session, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    wanted = set(ids)
    found: dict[int, dict[str, Any]] = {i: {} for i in wanted}
    if wanted:
        for item_id, name, value in session.execute(
            select(ItemProperty.item_id, ItemProperty.name, ItemProperty.value).where(
                ItemProperty.item_id.in_(wanted)
            )
        ):
            found[item_id][name] = value
    return found


def pool_properties(session: Session, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    wanted = set(ids)
    found: dict[int, dict[str, Any]] = {i: {} for i in wanted}
    if wanted:
        for pool_id, name in session.execute(
            select(VolumePool.id, VolumePool.name).where(VolumePool.id.in_(wanted))
        ):
            found[pool_id]["name"] = name
        for pool_id, name, value in session.execute(
            select(
                VolumePoolProperty.pool_id, VolumePoolProperty.name, VolumePoolProperty.value
            ).where(VolumePoolProperty.pool_id.in_(wanted))
        ):
            found[pool_id][name] = value
    return found
