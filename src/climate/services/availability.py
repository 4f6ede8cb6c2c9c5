"""Availability use cases: the earliest windows a lease would be admitted in, and a capacity
timeline. Read-only: a reader transaction, no admission lock (docs/availability.md)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from climate.context import ServiceContext
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db.calendar_cache import HISTORY
from climate.domain.actor import Actor
from climate.domain.requests import ReservationRequest
from climate.errors import InvalidInput
from climate.fairshare import admission as fairshare
from climate.planner.availability import SearchRange, Window, earliest, timeline
from climate.planner.instance_search import instance_timeline
from climate.planner.instances import Size
from climate.planner.query import parse_query
from climate.resources import pick
from climate.resources.base import ResourceType
from climate.resources.capabilities import Items, PooledCapacity, SharedHosts, WholeHosts
from climate.services.placing import instance_space, placers, searchable

RULE = "climate:availability:get"
NAMES_RULE = "blazar:oshosts:get"
"""Who may list hosts sees the names of the hosts a window would get; others their ids."""
MAX_WINDOWS = 20
MAX_STEP = 86_400
MAX_BUCKETS = 10_000
HOST_TYPE = host_rows.RESOURCE_TYPE
INSTANCE_TYPE = instance_rows.RESOURCE_TYPE


@dataclass(frozen=True)
class AvailabilityQuery:
    reservations: Sequence[ReservationRequest]
    """As for a lease: each searched by its resource type; a window must fit all at once."""
    duration: int
    """Seconds."""
    search_end: dt.datetime
    search_start: dt.datetime | None = None
    """None (or a time already past) means now."""
    limit: int = 3
    step: int = 60
    """Window starts are multiples of this many seconds since the epoch."""


@dataclass(frozen=True)
class OfferedReservation:
    resource_type: str
    params: Mapping[str, Any]
    """As validated by its resource type."""
    resource_ids: tuple[int, ...]
    """Hosts, items or the volume pool it would get."""
    resource_names: tuple[str, ...] | None
    """None when the caller may not list them (hosts: ``NAMES_RULE``)."""
    quantities: tuple[int, ...]
    """Per resource: instances on each host, GB from the pool; empty for whole resources."""
    available: int
    """In the reservation's units: free hosts or items, instances of its size that fit, most
    GB free in one pool."""


@dataclass(frozen=True)
class Offer:
    start: dt.datetime
    end: dt.datetime
    reservations: tuple[OfferedReservation, ...]
    usage_rules: tuple[dict[str, object], ...] = ()
    """The usage rules a lease taking this window would break (docs/fair-share.md)."""


@dataclass(frozen=True)
class TimelineQuery:
    end: dt.datetime
    start: dt.datetime | None = None
    """None means now."""
    bucket: int = 3600
    resource_type: str = HOST_TYPE
    hypervisor_properties: str = ""
    """Whole hosts only."""
    resource_properties: str = ""
    pool: str | None = None
    """Items: their pool (a floating IP's network, a segment's physical network); volumes: the
    pool's name. Not for hosts and instances."""
    vcpus: int | None = None
    """Instances: the size counted (vCPUs and memory required, disk 0 by default); refused
    for the other types."""
    memory_mb: int | None = None
    disk_gb: int | None = None


@dataclass(frozen=True)
class Capacity:
    resource_type: str
    start: dt.datetime
    bucket: int
    total: int
    """Whole resources: how many match; volumes: the GB of the matching pools; instances: how
    many of the size the matching hosts hold when empty."""
    free: Sequence[int]
    """Per bucket, free for all of it: resources; GB; instances of the size."""
    busy: Sequence[int] | None = None
    """Whole resources: busy for all of the bucket."""
    partly: Sequence[int] | None = None
    """Whole resources: busy for part of the bucket."""
    largest: Sequence[int] | None = None
    """Shared capacity: the most free in one pool (GB) or on one host (instances)."""


class AvailabilityService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def search(self, actor: Actor, query: AvailabilityQuery) -> list[Offer]:
        """The ``limit`` earliest windows of ``duration`` inside the range in which every
        reservation would be admitted now (without moving other leases), with what each would
        get. Names no lease.

        :raises InvalidInput: a field is wrong (named in the message).
        """
        self.ctx.policy.enforce(actor, RULE, {"project_id": actor.project_id})
        now = self.ctx.clock.now()
        start = now if query.search_start is None else max(query.search_start, now)
        self._check_range(start, query.search_end, "search_start", "search_end")
        if query.duration <= 0:
            raise InvalidInput("duration", f"must be positive, not {query.duration} seconds")
        if query.duration > (query.search_end - start).total_seconds():
            raise InvalidInput(
                "duration", f"{query.duration} seconds is longer than the search range"
            )
        if not 1 <= query.limit <= MAX_WINDOWS:
            raise InvalidInput("limit", f"must be between 1 and {MAX_WINDOWS}, not {query.limit}")
        if not 1 <= query.step <= MAX_STEP:
            raise InvalidInput("step", f"must be between 1 and {MAX_STEP} seconds")
        if not query.reservations:
            raise InvalidInput("reservations", "at least one reservation is needed")
        by_type: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
        params_of: dict[int, Mapping[str, Any]] = {}
        for i, request in enumerate(query.reservations):
            field = f"reservations[{i}]"
            rtype = pick(self.ctx.resource_types, request.resource_type, f"{field}.resource_type")
            params = rtype.validate(request.fields, None, field)
            if not searchable(rtype):
                raise InvalidInput(
                    f"{field}.resource_type", f"availability of {rtype.name} cannot be searched"
                )
            by_type.setdefault(rtype.name, []).append((i, params))
            params_of[i] = params
        search = SearchRange(
            math.ceil(start.timestamp()),
            math.floor(query.search_end.timestamp()),
            query.duration,
            query.step,
        )
        with (
            self.ctx.db.reader() as session,
            placers(self.ctx.resource_types, session, by_type, search) as found,
        ):
            windows = earliest(found, search, query.limit)
            named = self.ctx.policy.allows(actor, NAMES_RULE)
            return [
                self._judged(session, actor, offer)
                for offer in self._offers(windows, query, params_of, named)
            ]

    def _judged(self, session: Session, actor: Actor, offer: Offer) -> Offer:
        """``offer`` with the usage rules a lease taking it would break."""
        if not self.ctx.settings.rules:
            return offer
        planned = [
            fairshare.Planned(r.resource_type, r.params, r.resource_ids, r.quantities)
            for r in offer.reservations
        ]
        broken = fairshare.forecast(self.ctx, session, actor, offer.start, offer.end, planned)
        return dataclasses.replace(offer, usage_rules=tuple(d.body() for d in broken))

    def _offers(
        self,
        windows: Sequence[Window],
        query: AvailabilityQuery,
        params_of: Mapping[int, Mapping[str, Any]],
        named: bool,
    ) -> list[Offer]:
        return [
            Offer(
                start=_moment(window.start),
                end=_moment(window.end),
                reservations=tuple(
                    OfferedReservation(
                        resource_type=str(query.reservations[p.index].resource_type),
                        params=params_of[p.index],
                        resource_ids=p.resources,
                        resource_names=p.names if named or not _hosted(p.index, query) else None,
                        quantities=p.quantities,
                        available=p.available,
                    )
                    for p in window.placements
                ),
            )
            for window in windows
        ]

    def timeline(self, actor: Actor, query: TimelineQuery) -> Capacity:
        """Per bucket of the range, what is free for all of it: whole hosts or items matching
        the queries (and how many are busy for all or part of it), volume GB, or instances of a
        size. Names no resource and no lease.

        :raises InvalidInput: a field is wrong (named in the message).
        """
        self.ctx.policy.enforce(actor, RULE, {"project_id": actor.project_id})
        now = self.ctx.clock.now()
        start = now if query.start is None else query.start
        if start < now - HISTORY:
            raise InvalidInput(
                "start", f"must be at most {HISTORY.days} days ago (older allocations are not kept)"
            )
        self._check_range(start, query.end, "start", "end")
        longest = self.ctx.settings.availability_max_days * 86_400
        if not 1 <= query.bucket <= longest:
            raise InvalidInput("bucket", f"must be between 1 and {longest} seconds")
        count = math.ceil((query.end - start).total_seconds() / query.bucket)
        if count > MAX_BUCKETS:
            raise InvalidInput(
                "bucket", f"the range would make {count} buckets; at most {MAX_BUCKETS}"
            )
        for field, value in (
            ("hypervisor_properties", query.hypervisor_properties),
            ("resource_properties", query.resource_properties),
        ):
            parse_query(field, value)
        rtype = pick(self.ctx.resource_types, query.resource_type, "resource_type")
        size = _timeline_size(rtype, query)
        first = math.floor(start.timestamp())
        with self.ctx.db.reader() as session:
            return self._chart(session, rtype, query, size, first, count)

    def _chart(
        self,
        session: Session,
        rtype: ResourceType,
        query: TimelineQuery,
        size: Size | None,
        first: int,
        count: int,
    ) -> Capacity:
        bucket = query.bucket
        at = _moment(first)
        if isinstance(rtype, WholeHosts | Items):
            if isinstance(rtype, WholeHosts):
                found = rtype.timeline(
                    session,
                    query.hypervisor_properties,
                    query.resource_properties,
                    first,
                    bucket,
                    count,
                )
            else:
                items = rtype.inventory.matching(
                    session, query.resource_properties, pool=query.pool
                )
                with rtype.calendar.reading(session) as calendar:
                    found = timeline(calendar, items, first, bucket, count)
            return Capacity(
                rtype.name,
                at,
                bucket,
                found.hosts,
                found.free.tolist(),
                busy=found.busy.tolist(),
                partly=found.partly.tolist(),
            )
        if isinstance(rtype, PooledCapacity):
            shared = rtype.timeline(
                session, query.pool, query.resource_properties, first, bucket, count
            )
        elif isinstance(rtype, SharedHosts) and size is not None:
            hosts = self.ctx.resource_types[HOST_TYPE]
            assert isinstance(hosts, WholeHosts)
            rooms = rtype.sized_hosts(session, query.resource_properties)
            with hosts.calendar.reading(session) as calendar:
                space = instance_space(
                    calendar, hosts.calendar.uses, rooms, first, first + bucket * count
                )
            shared = instance_timeline(space, size, first, bucket, count)
        else:
            raise InvalidInput("resource_type", f"{rtype.name} has no capacity timeline")
        return Capacity(
            rtype.name,
            at,
            bucket,
            shared.total,
            shared.free.tolist(),
            largest=shared.largest.tolist(),
        )

    def _check_range(
        self, start: dt.datetime, end: dt.datetime, start_field: str, end_field: str
    ) -> None:
        if end <= start:
            raise InvalidInput(end_field, f"must be after {start_field} ({start.isoformat()})")
        longest = dt.timedelta(days=self.ctx.settings.availability_max_days)
        if end - start > longest:
            raise InvalidInput(
                end_field, f"the range may span at most {longest.days} days from {start_field}"
            )


def _timeline_size(rtype: ResourceType, query: TimelineQuery) -> Size | None:
    """The instance size a timeline counts, after refusing the filters that do not apply.

    :raises InvalidInput: naming the field.
    """
    if query.hypervisor_properties and not isinstance(rtype, WholeHosts):
        raise InvalidInput("hypervisor_properties", f"only for {HOST_TYPE}, not {rtype.name}")
    if query.pool is not None and not isinstance(rtype, Items | PooledCapacity):
        raise InvalidInput("pool", f"not for {rtype.name}: only items and volumes have pools")
    fields = {"vcpus": query.vcpus, "memory_mb": query.memory_mb, "disk_gb": query.disk_gb}
    if not isinstance(rtype, SharedHosts):
        given = [name for name, value in fields.items() if value is not None]
        if given:
            raise InvalidInput(given[0], f"only for {INSTANCE_TYPE}, not {rtype.name}")
        return None
    for name in ("vcpus", "memory_mb"):
        if fields[name] is None:
            raise InvalidInput(name, f"required for {INSTANCE_TYPE}: the size counted")
    for name, value in fields.items():
        lowest = 0 if name == "disk_gb" else 1
        if value is not None and value < lowest:
            raise InvalidInput(name, f"must be at least {lowest}, not {value}")
    return Size(query.vcpus or 0, query.memory_mb or 0, query.disk_gb or 0)


def _hosted(index: int, query: AvailabilityQuery) -> bool:
    """Whether the reservation's resources are hosts (whose names ``NAMES_RULE`` guards)."""
    return query.reservations[index].resource_type in (HOST_TYPE, INSTANCE_TYPE)


def _moment(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
