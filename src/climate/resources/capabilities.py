"""What resource types can do beyond ``ResourceType``, for the modules outside ``resources/``.

Those find a type by what it can do (``isinstance(t, WholeHosts)``, ``item_kinds(types)``),
never by its class: the concrete types are plugins and only ``resources/`` imports them.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.orm import Session

from climate.db.calendar_cache import CalendarCache
from climate.db.tables import Reservation
from climate.planner.availability import Timeline
from climate.planner.calendar import HostSet
from climate.planner.capacity_search import AmountTimeline
from climate.planner.hosts import HostsView
from climate.planner.instances import HostRoom
from climate.resources.base import ResourceType
from climate.resources.item_inventory import ItemInventory
from climate.resources.kinds import Kind


class HostMatching(Protocol):
    def matching(
        self, session: Session, hypervisor_properties: str, resource_properties: str
    ) -> HostSet:
        """The reservable hosts matching both queries."""
        ...


class WholeHosts(abc.ABC):
    """Reserves whole hosts, over the hosts' calendar (which also sees their instance uses)."""

    inventory: HostMatching
    calendar: CalendarCache

    @abc.abstractmethod
    def view(
        self,
        session: Session,
        params: Mapping[str, Any],
        start: dt.datetime,
        end: dt.datetime,
        exclude: Sequence[str] = (),
    ) -> HostsView:
        """The planner's view of the hosts matching a reservation's ``params`` around
        [start, end), leaving out the allocations of ``exclude``, each host priced where the
        price table sets them apart (the cheapest are chosen first)."""

    @abc.abstractmethod
    def timeline(
        self,
        session: Session,
        hypervisor_properties: str,
        resource_properties: str,
        start: int,
        bucket: int,
        count: int,
    ) -> Timeline:
        """How many matching hosts are free, busy or partly busy per bucket (seconds)."""


class SharedHosts(abc.ABC):
    """Packs reservations of a size onto hosts that share their capacity over time; searched
    for together with whole hosts, over the ``WholeHosts`` type's calendar."""

    calendar: CalendarCache
    """The ``WholeHosts`` type's (``load_resource_types`` joins them): it holds the hosts'
    instance uses beside their whole-host spans."""

    @abc.abstractmethod
    def sized_hosts(self, session: Session, resource_properties: str) -> list[HostRoom]:
        """The reservable hosts matching the query that have a size, scaled by their ratios."""

    @abc.abstractmethod
    def rooms(
        self, session: Session, reservation: Reservation, start: dt.datetime, end: dt.datetime
    ) -> list[HostRoom]:
        """Where the reservation's share may go over [start, end), with what others use."""

    @abc.abstractmethod
    def changed(self, session: Session, host_ids: set[int]) -> None:
        """The whole-host calendar's view of these hosts' shared usage is stale."""


class PooledCapacity(abc.ABC):
    """Shares the capacity of named pools (volumes: GB of storage pools)."""

    @abc.abstractmethod
    def timeline(
        self,
        session: Session,
        pool: str | None,
        resource_properties: str,
        start: int,
        bucket: int,
        count: int,
    ) -> AmountTimeline:
        """Free capacity per bucket (seconds) in the pools named ``pool`` (any, for None)
        matching the query."""


class Items(abc.ABC):
    """Reserves whole items of one ``Kind``, each exclusively, over that kind's calendar."""

    kind: Kind
    inventory: ItemInventory
    calendar: CalendarCache


def item_kinds(types: Mapping[str, ResourceType]) -> dict[str, Kind]:
    """The kinds of the item types among ``types``, by resource type name, in their order."""
    return {name: t.kind for name, t in types.items() if isinstance(t, Items)}
