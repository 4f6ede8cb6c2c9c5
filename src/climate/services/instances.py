"""Instance allocations: which reservations run how many instances on which host."""

from __future__ import annotations

import datetime as dt
from typing import Any

from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db.allocation_listing import AllocationListing, lease_text
from climate.domain.actor import Actor
from climate.errors import InvalidInput, NotFound
from climate.services.hosts import HostAllocations, shown
from climate.services.inventory import grouped, parse_id


class InstanceAllocationService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.listing = AllocationListing(
            instance_rows.listed_allocations, instance_rows.host_of_owner
        )

    def allocations(
        self,
        actor: Actor,
        *,
        host_id: str | None = None,
        lease_id: str | None = None,
        reservation_id: str | None = None,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[HostAllocations]:
        """Instance allocations per host from ``start`` (default now) on: one host's (even
        none), or a page of the hosts that have some (by id; ``page.marker`` is a host id); a
        caller whom the ``admin`` rule does not cover sees only their project's.

        :raises NotFound: ``host_id`` is no host.
        :raises InvalidInput: ``page.marker`` is no host.
        """
        self.ctx.policy.enforce(actor, "climate:instances:get_allocations", actor.owner())
        now = self.ctx.clock.now()
        scope = self.ctx.policy.scope(actor)
        filters: dict[str, Any] = {
            "lease_id": lease_id,
            "reservation_id": reservation_id,
            "project_id": scope,
            "start": start or now,
            "end": end,
        }
        whole = lease_id is None and reservation_id is None and end is None
        with self.ctx.db.reader() as session:
            host_ids: list[int] | None
            if host_id is not None:
                known = parse_id(str(host_id))
                if known is None or host_rows.get(session, known) is None:
                    raise NotFound("Host", host_id)
                host_ids = [known]
            else:
                after = None
                if page.marker is not None:
                    after = parse_id(page.marker)
                    if after is None or host_rows.get(session, after) is None:
                        raise InvalidInput("marker", f"no host {page.marker}")
                limit = page.size(self.ctx.settings.max_page_size)
                host_ids = None
                if whole:
                    host_ids = self.listing.hosts(
                        session, filters["start"], now, project_id=scope, after=after, limit=limit
                    )
                if host_ids is None:
                    host_ids = instance_rows.allocated_hosts(
                        session, after=after, limit=limit, **filters
                    )
            if whole:
                kept = self.listing.per_host(session, host_ids, filters["start"], now)
                if kept is not None:
                    return shown(kept, lease_text(filters["start"]), scope)
            rows = instance_rows.allocations(session, host_ids=host_ids, **filters)
        per_host = grouped(host_ids, rows, lambda row: row.host_id)
        return [HostAllocations(h, r) for h, r in per_host.items()]
