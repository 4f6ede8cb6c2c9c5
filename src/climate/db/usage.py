"""What a project holds over a time range, for usage rules (fairshare/): one indexed range scan
per allocation table a rule counts, bounded by the leases' windows (``ix_leases_project_end``),
never a walk through the project's history. The statements are built once (admission runs
them on every lease)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

from sqlalchemy import BindParameter, Float, Select, bindparam, literal, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

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


class Held(NamedTuple):
    """One allocation row of the project: ``what`` is a host, item or pool id; ``start`` and
    ``end`` in seconds since the epoch; ``amount`` the instances' vCPUs or the volume's GB (0
    for whole resources)."""

    resource_type: str
    lease_id: str
    user_id: str
    what: int
    start: float
    end: float
    amount: int


class epoch(FunctionElement[float]):
    """A timestamp column as seconds since the epoch, computed by the database: no datetime
    is built per row."""

    type = Float()
    inherit_cache = True


@compiles(epoch, "sqlite")
def _sqlite_epoch(element: epoch, compiler: Any, **kw: Any) -> str:
    # julianday's double is off by some microseconds: to the millisecond, equal times compare
    # equal again (back-to-back leases stay back to back).
    days = f"julianday({compiler.process(element.clauses, **kw)})"
    return f"ROUND(({days} - 2440587.5) * 86400.0, 3)"


@compiles(epoch, "postgresql")
def _postgresql_epoch(element: epoch, compiler: Any, **kw: Any) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)}) AS FLOAT)"


_PROJECT: BindParameter[Any] = bindparam("project")
_USER: BindParameter[Any] = bindparam("user")
_LOW: BindParameter[Any] = bindparam("low")
_HIGH: BindParameter[Any] = bindparam("high")
_LEASES = (Lease.project_id == _PROJECT, Lease.end_date > _LOW, Lease.start_date < _HIGH)


def _held(table: Any, kind: str, what: Any, amount: Any = 0) -> Select[Any]:
    return (
        select(
            literal(kind),
            table.lease_id,
            Lease.user_id,
            what,
            epoch(table.start_date),
            epoch(table.end_date),
            literal(amount) if isinstance(amount, int) else amount,
        )
        .join(Lease, Lease.id == table.lease_id)
        .where(*_LEASES, table.end_date > _LOW, table.start_date < _HIGH)
    )


_STATEMENTS: dict[str, Select[Any]] = {
    "physical:host": _held(HostAllocation, "physical:host", HostAllocation.host_id),
    "virtual:instance": _held(
        InstanceAllocation,
        "virtual:instance",
        InstanceAllocation.host_id,
        InstanceAllocation.vcpus,
    ),
    "virtual:floatingip": _held(ItemAllocation, "virtual:floatingip", ItemAllocation.item_id)
    .join(Item, Item.id == ItemAllocation.item_id)
    .where(Item.kind == FLOATING_IP),
    "virtual:volume": _held(
        VolumeAllocation, "virtual:volume", VolumeAllocation.pool_id, VolumeAllocation.size_gb
    ),
}
_USERS = {kind: statement.where(Lease.user_id == _USER) for kind, statement in _STATEMENTS.items()}


def held(
    session: Session,
    project_id: str,
    user_id: str | None,
    low: dt.datetime,
    high: dt.datetime,
    resource_types: Collection[str],
) -> list[Held]:
    """Every allocation of ``project_id``'s leases (of ``user_id``'s only, unless None;
    deleted leases too: what they held until then was used) of ``resource_types``
    overlapping [low, high)."""
    found: list[Held] = []
    bounds = {"project": project_id, "user": user_id, "low": low, "high": high}
    statements = _STATEMENTS if user_id is None else _USERS
    for resource_type, statement in statements.items():
        if resource_type in resource_types:
            found.extend(Held._make(row) for row in session.execute(statement, bounds))
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
