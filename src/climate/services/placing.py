"""What the availability search reads for each resource type: the planner's placers
(``planner/availability.py``, ``planner/instance_search.py``,
``planner/capacity_search.py``) built from the calendars, inventories and
allocations as committed, in a reader session (docs/availability.md).

Whole hosts and instances exclude each other, so when a request holds instances, its whole-host
reservations are searched with them by one ``ComputePlacer``; every other type is searched on
its own and the search intersects them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from sqlalchemy.orm import Session

from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db import volumes as volume_rows
from climate.errors import Conflict, InvalidInput
from climate.planner.availability import HostPlacer, HostRequest, Placer, SearchRange
from climate.planner.calendar import Calendar, HostSet, moment
from climate.planner.capacity_search import StoragePool, VolumePlacer, VolumeRequest
from climate.planner.instance_search import (
    ComputePlacer,
    InstanceHost,
    InstanceRequest,
    InstanceSpace,
    whole_spans,
)
from climate.planner.instances import HostRoom, InstanceDemand, Size, check_possible
from climate.planner.query import parse_query
from climate.resources.base import ResourceType
from climate.resources.hosts import PhysicalHostType
from climate.resources.instances import InstanceType
from climate.resources.items import ItemType
from climate.resources.volumes import VolumeType, pool_properties

HOSTS = PhysicalHostType.name
INSTANCES = InstanceType.name
LOOKAROUND = host_rows.LOOKAROUND.total_seconds()

Members = Sequence[tuple[int, Mapping[str, Any]]]
"""Validated reservations of one type: (position in the request, parameters)."""


@runtime_checkable
class Searchable(Protocol):
    """A resource type (a plugin) that builds its own placer for an availability search."""

    def searching(
        self, session: Session, reservations: Members, search: SearchRange
    ) -> contextlib.AbstractContextManager[Placer]: ...


def searchable(rtype: ResourceType) -> bool:
    """Whether reservations of ``rtype`` can be searched for."""
    return isinstance(rtype, PhysicalHostType | InstanceType | ItemType | VolumeType | Searchable)


@contextlib.contextmanager
def placers(
    types: Mapping[str, ResourceType],
    session: Session,
    by_type: Mapping[str, Members],
    search: SearchRange,
) -> Iterator[list[Placer]]:
    """One placer per resource type of the request (whole hosts and instances share one),
    over calendars held still until the search is done.

    :raises InvalidInput: a reservation asks what no resource could ever give (naming it).
    """
    with contextlib.ExitStack() as stack:
        found: list[Placer] = []
        for name, members in by_type.items():
            rtype = types[name]
            if name == HOSTS and INSTANCES in by_type:
                continue  # searched with the instances
            if isinstance(rtype, InstanceType):
                found.append(
                    _compute(types, stack, session, by_type.get(HOSTS, ()), members, search)
                )
            elif isinstance(rtype, ItemType):
                calendar = stack.enter_context(rtype.calendar.reading(session))
                requests = [_item_request(rtype, session, i, params) for i, params in members]
                found.append(HostPlacer(calendar, requests, search))
            elif isinstance(rtype, VolumeType):
                found.append(_volumes(session, members, search))
            elif isinstance(rtype, Searchable):
                found.append(stack.enter_context(rtype.searching(session, members, search)))
            else:
                raise InvalidInput(
                    f"reservations[{members[0][0]}].resource_type",
                    f"availability of {name} cannot be searched",
                )
        yield found


def _item_request(
    rtype: ItemType, session: Session, index: int, params: Mapping[str, Any]
) -> HostRequest:
    try:
        wanted = rtype.demand(session, params)
    except InvalidInput as bad:
        raise InvalidInput(f"reservations[{index}].{bad.field}", _problem(bad)) from None
    return HostRequest(
        index, wanted.candidates, wanted.min, wanted.max, wanted.required, "min" in params
    )


def _problem(bad: InvalidInput) -> str:
    return str(bad).removeprefix(f"{bad.field}: ")


def _compute(
    types: Mapping[str, ResourceType],
    stack: contextlib.ExitStack,
    session: Session,
    host_members: Members,
    members: Members,
    search: SearchRange,
) -> ComputePlacer:
    host_type = types[HOSTS]
    instance_type = types[INSTANCES]
    assert isinstance(host_type, PhysicalHostType) and isinstance(instance_type, InstanceType)
    hosts = [
        HostRequest(
            index,
            host_type.inventory.matching(
                session, params["hypervisor_properties"], params["resource_properties"]
            ),
            params["min"],
            params["max"],
        )
        for index, params in host_members
    ]
    rooms: dict[int, HostRoom] = {}
    requests = []
    for index, params in members:
        size = Size(params["vcpus"], params["memory_mb"], params["disk_gb"])
        matching = instance_type.sized_hosts(session, params["resource_properties"])
        request = InstanceRequest(
            index,
            frozenset(h.id for h in matching),
            size,
            params["amount"],
            params["affinity"],
        )
        if matching:
            _check_possible(request, matching, search)
        rooms.update((h.id, h) for h in matching)
        requests.append(request)
    calendar = stack.enter_context(host_type.calendar.reading(session))
    space = instance_space(session, calendar, list(rooms.values()), search.start, search.end)
    return ComputePlacer(calendar, hosts, space, requests, search)


def _check_possible(
    request: InstanceRequest, matching: list[HostRoom], search: SearchRange
) -> None:
    """What no matching host could hold even empty is bad input, as at admission."""
    demand = InstanceDemand(
        moment(search.start),
        moment(search.start + search.duration),
        request.amount,
        request.size,
        request.affinity,
    )
    try:
        check_possible(demand, matching)
    except InvalidInput as bad:
        raise InvalidInput(f"reservations[{request.index}].{bad.field}", _problem(bad)) from None
    except Conflict as conflict:  # affinity: more than one host's worth
        raise InvalidInput(f"reservations[{request.index}].amount", str(conflict)) from None


def instance_space(
    session: Session, calendar: Calendar, rooms: Sequence[HostRoom], start: int, end: int
) -> InstanceSpace:
    """Hosts with a size, their whole-host spans and their instance uses over [start, end)
    and a look-around on both sides."""
    ids = [h.id for h in rooms]
    uses = instance_rows.uses(
        session, ids, moment(start - LOOKAROUND), moment(end + LOOKAROUND), other_than=""
    )
    hosts = HostSet((h.id, h.name) for h in rooms)
    position, starts, ends = calendar.spans_of(hosts, start - LOOKAROUND, end + LOOKAROUND)
    at = {h: k for k, h in enumerate(ids)}
    use_position = np.array([at[u.host_id] for u in uses], dtype=np.int64)
    use_starts = np.array([u.start.timestamp() for u in uses], dtype=np.float64)
    use_ends = np.array([u.end.timestamp() for u in uses], dtype=np.float64)
    whole = whole_spans(position, starts, ends, use_position, use_starts, use_ends)
    sizes = np.array([(u.vcpus, u.memory_mb, u.disk_gb) for u in uses], dtype=np.int64)
    return InstanceSpace(
        [InstanceHost(h.id, h.name, h.capacity) for h in rooms],
        (position[whole], starts[whole], ends[whole]),
        (use_position, use_starts, use_ends, sizes.reshape(-1, 3)),
        LOOKAROUND,
    )


def storage_pools(
    session: Session, pool: str | None, resource_properties: str, start: int, end: int
) -> list[StoragePool]:
    """The reservable pools named ``pool`` (any, for None) matching the query, with what is
    held in each over [start, end)."""
    query = parse_query("resource_properties", resource_properties)
    matching = [
        p
        for p in volume_rows.reservable(session)
        if (pool is None or p.name == pool) and query.matches(pool_properties(p))
    ]
    uses = volume_rows.uses(
        session, [p.id for p in matching], moment(start), moment(end), other_than=""
    )
    return [
        StoragePool(
            p.id,
            p.name,
            p.capacity_gb,
            [(s.timestamp(), e.timestamp(), gb) for s, e, gb in uses[p.id]],
        )
        for p in matching
    ]


def _volumes(session: Session, members: Members, search: SearchRange) -> VolumePlacer:
    pools: dict[int, StoragePool] = {}
    requests = []
    names = {p.name for p in volume_rows.reservable(session)}
    for index, params in members:
        named = params["pool"]
        if named is not None and named not in names:
            raise InvalidInput(
                f"reservations[{index}].pool", f"no reservable volume pool named {named!r}"
            )
        found = storage_pools(
            session, named, params["resource_properties"], search.start, search.end
        )
        need = params["size_gb"] * params["amount"]
        largest = max((p.capacity for p in found), default=need)
        if need > largest:
            raise InvalidInput(
                f"reservations[{index}].size_gb",
                f"{params['amount']} x {params['size_gb']} GB = {need} GB is more than any "
                f"matching pool can hold (the largest holds {largest} GB)",
            )
        pools.update((p.id, p) for p in found)
        requests.append(VolumeRequest(index, tuple(p.id for p in found), need))
    return VolumePlacer(list(pools.values()), requests, search)
