"""The dashboard's reads: who holds which resource when (the timeline), and a project's leases
(the calendar feed). A caller sees the leases the ``blazar:leases:get`` rule lets them read in
full; every other booking only as busy time, with no lease, project, name or status."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from climate.context import ServiceContext
from climate.db import hosts as host_rows
from climate.db import timeline as rows
from climate.db import volumes as volume_rows
from climate.domain.actor import Actor
from climate.errors import InvalidInput
from climate.resources.capabilities import item_kinds
from climate.services.availability import NAMES_RULE
from climate.services.availability import RULE as AVAILABILITY_RULE

LEASE_RULE = "blazar:leases:get"
HOST_TYPE = host_rows.RESOURCE_TYPE
VOLUME_TYPE = volume_rows.RESOURCE_TYPE
DEFAULT_SPAN = dt.timedelta(days=14)


class LeaseRef(NamedTuple):
    """A lease as a timeline names it."""

    id: str
    name: str
    project_id: str
    status: str


Bar = tuple[int, int, int, int, int | None]
"""One allocation drawn: index into ``TimelineData.resources``, start and end (seconds since
the epoch), amount (as ``db.timeline.Allocation``'s), and index into ``TimelineData.leases``
(None: a booking the caller may not read)."""


@dataclass(frozen=True)
class TimelineData:
    resource_type: str
    start: dt.datetime
    end: dt.datetime
    now: dt.datetime
    resources: Sequence[rows.ResourceRow]
    leases: Sequence[LeaseRef]
    bars: Sequence[Bar]


class TimelineService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.kinds = item_kinds(ctx.resource_types)
        self.resource_types = (HOST_TYPE, *self.kinds, VOLUME_TYPE)
        """What a timeline shows rows of; instances are drawn on their hosts."""

    def timeline(
        self,
        actor: Actor,
        resource_type: str,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
    ) -> TimelineData:
        """Every resource of ``resource_type`` with the allocations overlapping [start, end)
        (default: now to two weeks on).

        :raises InvalidInput: an unknown resource type, or a window that is empty or longer
            than ``availability_max_days``.
        """
        self.ctx.policy.enforce(actor, AVAILABILITY_RULE, actor.owner())
        if resource_type not in self.resource_types:
            offered = ", ".join(self.resource_types)
            raise InvalidInput("resource_type", f"must be one of {offered}")
        now = self.ctx.clock.now()
        start = now if start is None else start
        end = start + DEFAULT_SPAN if end is None else end
        if end <= start:
            raise InvalidInput("end", "must be after start")
        longest = self.ctx.settings.availability_max_days
        if end - start > dt.timedelta(days=longest):
            raise InvalidInput("end", f"the window may be at most {longest} days long")
        with self.ctx.db.reader() as session:
            if resource_type == HOST_TYPE:
                resources = rows.hosts(session)
                found = rows.host_allocations(session, start, end)
                if not self.ctx.policy.allows(actor, NAMES_RULE):
                    resources = [r._replace(name=f"host {r.id}") for r in resources]
            elif resource_type == VOLUME_TYPE:
                resources = rows.volume_pools(session)
                found = rows.volume_allocations(session, start, end)
            else:
                kind = self.kinds[resource_type].kind
                resources = rows.items(session, kind)
                found = rows.item_allocations(session, kind, start, end)
        scope, own = self._readable(actor)
        index = {r.id: i for i, r in enumerate(resources)}
        leases: list[LeaseRef] = []
        lease_index: dict[str, int] = {}
        bars: list[Bar] = []
        for resource, begins, ends, amount, lease_id, name, project, status in found:
            place = None
            if scope is None or (own and project == scope):
                place = lease_index.get(lease_id)
                if place is None:
                    place = lease_index[lease_id] = len(leases)
                    leases.append(LeaseRef(lease_id, name, project, status))
            bars.append((index[resource], begins, ends, amount, place))
        return TimelineData(resource_type, start, end, now, resources, leases, bars)

    def feed(self, actor: Actor, project_id: str | None = None) -> list[rows.LeaseRow]:
        """The live leases of the caller's project, for a calendar; every project's (or the one
        asked for) to those the ``admin`` rule allows. Another project asked for by anyone
        else gives no leases, as the lease list does."""
        self.ctx.policy.enforce(actor, LEASE_RULE, actor.owner())
        scope = self.ctx.policy.scope(actor)
        if scope is not None:
            if project_id not in (None, scope):
                return []
            project_id = scope
        with self.ctx.db.reader() as session:
            return rows.leases(session, project_id)

    def _readable(self, actor: Actor) -> tuple[str | None, bool]:
        """Whose leases the caller reads in full: every project's (None), or its own project's
        if the lease rule lets it read them (the bool)."""
        scope = self.ctx.policy.scope(actor)
        if scope is None:
            return None, True
        return scope, self.ctx.policy.allows(actor, LEASE_RULE, actor.owner())
