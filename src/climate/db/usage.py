"""What a project holds over a time range, for usage rules (fairshare/): one indexed range scan
per allocation table a rule counts, bounded by the leases' windows (``ix_leases_project_end``),
never a walk through the project's history. The statements are built once (admission runs
them on every lease)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from typing import Any, cast

from sqlalchemy import BindParameter, Float, Select, bindparam, literal, select, union_all
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

from climate.db import raw
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


Held = tuple[str, str, str, int, float, float, int, bool]
"""One allocation row, as the database gives it (admission reads some fifty per lease: no
object is made of it): resource type, lease id, user id, the host, item or pool id, start and
end in seconds since the epoch, the amount (the instances' vCPUs or the volume's GB; 0 for
whole resources), and whether it was read as the user's (else as the project's)."""


class epoch(FunctionElement[float]):
    """A timestamp column as seconds since the epoch, computed by the database: no datetime
    is built per row."""

    type = Float()
    inherit_cache = True


@compiles(epoch, "sqlite")
def _sqlite_epoch(element: epoch, compiler: Any, **kw: Any) -> str:
    # julianday's double is off by some microseconds: to the millisecond, equal times compare
    # equal again (back-to-back leases stay back to back). The count of milliseconds is
    # rounded half up by CAST, not by ROUND(x, 3), which goes through text (up to a third of the
    # statement's time): the same doubles for any time after 1970 (tests/test_usage_epoch.py).
    days = f"julianday({compiler.process(element.clauses, **kw)})"
    return f"CAST(({days} - 2440587.5) * 86400000.0 + 0.5 AS INTEGER) / 1000.0"


@compiles(epoch, "postgresql")
def _postgresql_epoch(element: epoch, compiler: Any, **kw: Any) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {compiler.process(element.clauses, **kw)}) AS FLOAT)"


_PROJECT: BindParameter[Any] = bindparam("project")
_USER: BindParameter[Any] = bindparam("user")
_BOUNDS: dict[bool, tuple[BindParameter[Any], BindParameter[Any]]] = {
    True: (bindparam("low"), bindparam("high")),
    False: (bindparam("project_low"), bindparam("project_high")),
}
_TABLES: dict[str, tuple[Any, Any, Any]] = {
    "physical:host": (HostAllocation, HostAllocation.host_id, 0),
    "virtual:instance": (InstanceAllocation, InstanceAllocation.host_id, InstanceAllocation.vcpus),
    "virtual:floatingip": (ItemAllocation, ItemAllocation.item_id, 0),
    "virtual:volume": (VolumeAllocation, VolumeAllocation.pool_id, VolumeAllocation.size_gb),
}


def _held(kind: str, mine: bool) -> Select[Any]:
    table, what, amount = _TABLES[kind]
    low, high = _BOUNDS[mine]
    statement = (
        select(
            literal(kind),
            table.lease_id,
            Lease.user_id,
            what,
            epoch(table.start_date),
            epoch(table.end_date),
            literal(amount) if isinstance(amount, int) else amount,
            literal(mine),
        )
        .join(Lease, Lease.id == table.lease_id)
        .where(
            Lease.project_id == _PROJECT,
            Lease.end_date > low,
            Lease.start_date < high,
            table.end_date > low,
            table.start_date < high,
        )
    )
    if kind == "virtual:floatingip":
        statement = statement.join(Item, Item.id == table.item_id).where(Item.kind == FLOATING_IP)
    return statement.where(Lease.user_id == _USER) if mine else statement


_STATEMENTS: dict[tuple[frozenset[str], bool], Any] = {}


def _statement(kinds: frozenset[str], project: bool) -> Any:
    """One statement for every part asked (built once per combination)."""
    found = _STATEMENTS.get((kinds, project))
    if found is None:
        parts = [_held(k, True) for k in sorted(kinds)]
        parts += [_held(k, False) for k in sorted(kinds)] if project else []
        found = _STATEMENTS[(kinds, project)] = parts[0] if len(parts) == 1 else union_all(*parts)
    return found


def held(
    session: Session,
    project_id: str,
    user_id: str,
    mine: tuple[dt.datetime, dt.datetime],
    ours: tuple[dt.datetime, dt.datetime] | None,
    resource_types: Collection[str],
) -> list[Held]:
    """In one statement: the allocations of ``user_id``'s leases in ``project_id`` over
    ``mine`` and, unless None, those of all the project's leases over ``ours`` (deleted
    leases too: what they held until then was used), of ``resource_types``."""
    kinds = frozenset(resource_types).intersection(_TABLES)
    if not kinds:
        return []
    bounds = {"project": project_id, "user": user_id, "low": mine[0], "high": mine[1]}
    if ours is not None:
        bounds |= {"project_low": ours[0], "project_high": ours[1]}
    return cast(list[Held], raw.rows(session, _statement(kinds, ours is not None), bounds))


def host_facts(session: Session) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, str]]]:
    """Every host (reservable or not) with ``HOST_FACTS`` and its extra properties; and, apart,
    only the extra properties (as text) of the hosts that have some."""
    columns = [getattr(Host, c) for c in HOST_FACTS]
    facts = {
        row[0]: dict(zip(HOST_FACTS, row[1:], strict=True))
        for row in session.execute(select(Host.id, *columns))
    }
    extras: dict[int, dict[str, str]] = {}
    for host_id, name, value in session.execute(
        select(HostProperty.host_id, HostProperty.name, HostProperty.value)
    ):
        facts[host_id][name] = value
        extras.setdefault(int(host_id), {})[str(name)] = str(value)
    return facts, extras


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
