"""Availability use cases: the earliest windows a lease would be admitted in, and a capacity
timeline. Read-only: a reader transaction, no admission lock (docs/availability.md)."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sqlalchemy.orm import Session

from climate.domain.actor import Actor
from climate.errors import InvalidInput
from climate.planner.availability import Placer, SearchRange, Timeline, earliest
from climate.planner.query import parse_query
from climate.resources import pick
from climate.resources.calendar_cache import HISTORY
from climate.services.context import ServiceContext

if TYPE_CHECKING:
    # Not at run time: services.leases imports services.offers, which imports this module.
    from climate.services.leases import ReservationRequest

RULE = "climate:availability:get"
NAMES_RULE = "blazar:oshosts:get"
"""Who may list hosts sees the names of the hosts a window would get; others their ids."""
MAX_WINDOWS = 20
MAX_STEP = 86_400
MAX_BUCKETS = 10_000
HOST_TYPE = "physical:host"


@runtime_checkable
class Searchable(Protocol):
    """A resource type whose reservations can be searched for (``PhysicalHostType``)."""

    def searching(
        self,
        session: Session,
        reservations: Sequence[tuple[int, Mapping[str, Any]]],
        search: SearchRange,
    ) -> contextlib.AbstractContextManager[Placer]: ...


@runtime_checkable
class Charted(Protocol):
    """A resource type that can tell its free capacity over time."""

    def timeline(
        self,
        session: Session,
        hypervisor_properties: str,
        resource_properties: str,
        start: int,
        bucket: int,
        count: int,
    ) -> Timeline: ...


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
    min: int
    max: int
    resource_ids: tuple[int, ...]
    resource_names: tuple[str, ...] | None
    """None when the caller may not list hosts."""
    available: int


@dataclass(frozen=True)
class Offer:
    start: dt.datetime
    end: dt.datetime
    reservations: tuple[OfferedReservation, ...]


@dataclass(frozen=True)
class TimelineQuery:
    end: dt.datetime
    start: dt.datetime | None = None
    """None means now."""
    bucket: int = 3600
    hypervisor_properties: str = ""
    resource_properties: str = ""


@dataclass(frozen=True)
class Capacity:
    start: dt.datetime
    bucket: int
    hosts: int
    """Hosts matching the query."""
    free: Sequence[int]
    busy: Sequence[int]
    partly: Sequence[int]


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
        searchers: dict[str, Searchable] = {}
        params_of: dict[int, Mapping[str, Any]] = {}
        for i, request in enumerate(query.reservations):
            field = f"reservations[{i}]"
            rtype = pick(self.ctx.resource_types, request.resource_type, f"{field}.resource_type")
            params = rtype.validate(request.fields, None, field)
            if not isinstance(rtype, Searchable):
                raise InvalidInput(
                    f"{field}.resource_type", f"availability of {rtype.name} cannot be searched"
                )
            searchers[rtype.name] = rtype
            by_type.setdefault(rtype.name, []).append((i, params))
            params_of[i] = params
        search = SearchRange(
            math.ceil(start.timestamp()),
            math.floor(query.search_end.timestamp()),
            query.duration,
            query.step,
        )
        with self.ctx.db.reader() as session, contextlib.ExitStack() as stack:
            placers = [
                stack.enter_context(searchers[name].searching(session, members, search))
                for name, members in by_type.items()
            ]
            windows = earliest(placers, search, query.limit)
        named = self.ctx.policy.allows(actor, NAMES_RULE)
        return [
            Offer(
                start=_moment(window.start),
                end=_moment(window.end),
                reservations=tuple(
                    OfferedReservation(
                        resource_type=str(query.reservations[p.index].resource_type),
                        min=int(params_of[p.index]["min"]),
                        max=int(params_of[p.index]["max"]),
                        resource_ids=p.resources,
                        resource_names=p.names if named else None,
                        available=p.available,
                    )
                    for p in window.placements
                ),
            )
            for window in windows
        ]

    def timeline(self, actor: Actor, query: TimelineQuery) -> Capacity:
        """Per bucket of the range, how many hosts matching the queries are free for all of it,
        busy for all of it and busy for part of it. Names no host and no lease.

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
        rtype = self.ctx.resource_types.get(HOST_TYPE)
        if not isinstance(rtype, Charted):
            raise InvalidInput("resource_type", f"{HOST_TYPE} is not offered here")
        first = math.floor(start.timestamp())
        with self.ctx.db.reader() as session:
            found = rtype.timeline(
                session,
                query.hypervisor_properties,
                query.resource_properties,
                first,
                query.bucket,
                count,
            )
        return Capacity(
            start=_moment(first),
            bucket=query.bucket,
            hosts=found.hosts,
            free=found.free.tolist(),
            busy=found.busy.tolist(),
            partly=found.partly.tolist(),
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


def _moment(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
