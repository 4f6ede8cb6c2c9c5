"""Instance allocations: which reservations run how many instances on which host."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from climate.db import instances as instance_rows
from climate.domain.actor import Actor
from climate.services.context import ServiceContext


@dataclass(frozen=True)
class HostInstances:
    host_id: int
    reservations: list[instance_rows.AllocationRow]


class InstanceAllocationService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def allocations(
        self,
        actor: Actor,
        *,
        lease_id: str | None = None,
        reservation_id: str | None = None,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
    ) -> list[HostInstances]:
        """Instance allocations per host (hosts in id order) from ``start`` (default now) on;
        a caller whom the ``admin`` rule does not cover sees only their project's."""
        self.ctx.policy.enforce(
            actor,
            "climate:instances:get_allocations",
            {"project_id": actor.project_id, "user_id": actor.user_id},
        )
        with self.ctx.db.reader() as session:
            rows = instance_rows.allocations(
                session,
                lease_id=lease_id,
                reservation_id=reservation_id,
                project_id=self.ctx.policy.scope(actor),
                start=start or self.ctx.clock.now(),
                end=end,
            )
        per_host: dict[int, list[instance_rows.AllocationRow]] = {}
        for row in rows:
            per_host.setdefault(row.host_id, []).append(row)
        return [HostInstances(h, r) for h, r in sorted(per_host.items())]
