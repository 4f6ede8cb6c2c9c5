"""The availability search's placers (``planner/availability.py``,
``planner/instance_search.py``, ``planner/capacity_search.py``), one per resource type of a
request, over the calendars, inventories and allocations as committed, in a reader session
(docs/availability.md).

Each resource type builds its own (``Searchable``: hosts, items, volumes, a plugin's type), but
instances: whole hosts and instances exclude each other, so when a request holds instances, its
whole-host reservations are searched with them by one ``ComputePlacer``, built here. The search
intersects the placers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.orm import Session

from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.errors import Conflict, InvalidInput
from climate.planner.availability import HostRequest, Placer, SearchRange
from climate.planner.calendar import Calendar, HostSet, moment
from climate.planner.instance_search import (
    ComputePlacer,
    InstanceHost,
    InstanceRequest,
    InstanceSpace,
    whole_spans,
)
from climate.planner.instance_uses import InstanceUses
from climate.planner.instances import HostRoom, InstanceDemand, Size, check_possible
from climate.resources.base import ResourceType, in_request
from climate.resources.capabilities import SharedHosts, WholeHosts

HOSTS = host_rows.RESOURCE_TYPE
INSTANCES = instance_rows.RESOURCE_TYPE
LOOKAROUND = host_rows.LOOKAROUND.total_seconds()

Members = Sequence[tuple[int, Mapping[str, Any]]]
"""Validated reservations of one type: (position in the request, parameters)."""


@runtime_checkable
class Searchable(Protocol):
    """A resource type that builds its own placer for an availability search: every one but
    instances (searched with whole hosts, as they exclude each other). Its ``searching`` raises
    ``InvalidInput`` naming ``reservations[<position>].<field>``."""

    def searching(
        self, session: Session, reservations: Members, search: SearchRange
    ) -> contextlib.AbstractContextManager[Placer]: ...


def searchable(rtype: ResourceType) -> bool:
    """Whether reservations of ``rtype`` can be searched for."""
    return isinstance(rtype, SharedHosts | Searchable)


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
            if isinstance(rtype, SharedHosts):
                found.append(
                    _compute(types, stack, session, by_type.get(HOSTS, ()), members, search)
                )
            elif isinstance(rtype, Searchable):
                found.append(stack.enter_context(rtype.searching(session, members, search)))
            else:
                raise InvalidInput(
                    f"reservations[{members[0][0]}].resource_type",
                    f"availability of {name} cannot be searched",
                )
        yield found


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
    assert isinstance(host_type, WholeHosts) and isinstance(instance_type, SharedHosts)
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
    space = instance_space(
        calendar, host_type.calendar.uses, list(rooms.values()), search.start, search.end
    )
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
        raise in_request(request.index, bad) from None
    except Conflict as conflict:  # affinity: more than one host's worth
        raise InvalidInput(f"reservations[{request.index}].amount", str(conflict)) from None


def instance_space(
    calendar: Calendar, uses: InstanceUses, rooms: Sequence[HostRoom], start: int, end: int
) -> InstanceSpace:
    """Hosts with a size, their whole-host spans and their instance uses over [start, end)
    and a look-around on both sides (``uses``: the calendar's, read where it is)."""
    hosts = HostSet((h.id, h.name) for h in rooms)
    position, starts, ends = calendar.spans_of(hosts, start - LOOKAROUND, end + LOOKAROUND)
    found = uses.within([h.id for h in rooms], start - LOOKAROUND, end + LOOKAROUND)
    whole = whole_spans(position, starts, ends, found.position, found.starts, found.ends)
    return InstanceSpace(
        [InstanceHost(h.id, h.name, h.capacity) for h in rooms],
        (position[whole], starts[whole], ends[whole]),
        (found.position, found.starts, found.ends, found.sizes),
        LOOKAROUND,
    )
