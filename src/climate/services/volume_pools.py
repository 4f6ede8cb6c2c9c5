"""Volume pool inventory use cases: create, list, show, update, delete, allocations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from climate import inputs
from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import volumes as volume_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import VolumePool
from climate.domain.actor import Actor
from climate.errors import Conflict, InvalidInput, NotFound, ResourceInUse
from climate.planner.capacity import peak
from climate.resources.base import text_field
from climate.services import inventory

RULES = "climate:volume_pools"
FOREVER = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class PoolAllocations:
    pool_id: int
    reservations: list[volume_rows.PoolAllocation]


def _capacity(value: object) -> int:
    if value is None:
        raise InvalidInput("capacity_gb", f"required: an integer from 1 to {inputs.MAX_INT}")
    return inputs.integer("capacity_gb", value, minimum=1)


class VolumePoolService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def create(self, actor: Actor, fields: Mapping[str, Any]) -> VolumePool:
        """Register a pool: ``name``, ``capacity_gb``, ``reservable`` and extra properties."""
        self.ctx.policy.enforce(actor, f"{RULES}:post")
        rest = dict(fields)
        name = text_field("name", rest.pop("name", None))
        capacity = _capacity(rest.pop("capacity_gb", None))
        usable = inventory.reservable(rest)
        properties = inventory.properties(rest, creating=True)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            if volume_rows.get_by_name(session, name) is not None:
                raise Conflict(f"name: a volume pool named {name!r} already exists")
            pool = VolumePool(name=name, capacity_gb=capacity, created_at=now)
            if usable is not None:
                pool.reservable = usable
            volume_rows.save(session, pool, properties)
            session.refresh(pool)
            inventory.audit(session, now, actor, "volume_pool", "create", pool.id, dict(fields))
            return pool

    def list_all(self, actor: Actor, page: Page = FIRST_PAGE) -> Sequence[VolumePool]:
        self.ctx.policy.enforce(actor, f"{RULES}:get")
        with self.ctx.db.reader() as session:
            return self._page(session, page)

    def get(self, actor: Actor, pool_id: str) -> VolumePool:
        self.ctx.policy.enforce(actor, f"{RULES}:get")
        with self.ctx.db.reader() as session:
            return _load(session, pool_id)

    def update(self, actor: Actor, pool_id: str, fields: Mapping[str, Any]) -> VolumePool:
        """Change ``capacity_gb``, ``reservable`` or extra properties. A smaller capacity is
        refused (409) while current or future allocations would not fit in it."""
        self.ctx.policy.enforce(actor, f"{RULES}:put")
        if not fields:
            raise InvalidInput("body", "no values to update")
        rest = dict(fields)
        if "name" in rest:
            raise InvalidInput("name", "cannot be changed")
        capacity = _capacity(rest.pop("capacity_gb")) if "capacity_gb" in rest else None
        usable = inventory.reservable(rest)
        properties = inventory.properties(rest, creating=False)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            pool = _load(session, pool_id)
            if capacity is not None:
                if capacity < pool.capacity_gb:
                    self._check_shrink(session, pool, capacity, now)
                pool.capacity_gb = capacity
            if usable is not None:
                pool.reservable = usable
            pool.updated_at = now
            volume_rows.save(session, pool, properties)
            session.refresh(pool)
            inventory.audit(session, now, actor, "volume_pool", "update", pool.id, dict(fields))
            return pool

    def _check_shrink(
        self, session: Session, pool: VolumePool, capacity: int, now: dt.datetime
    ) -> None:
        uses = volume_rows.uses(session, [pool.id], now, FOREVER, "")
        used = peak(uses[pool.id], now, FOREVER)
        if used > capacity:
            raise ResourceInUse(
                f"capacity_gb: volume pool {pool.name} has up to {used} GB reserved from now on; "
                f"it cannot shrink to {capacity} GB"
            )

    def delete(self, actor: Actor, pool_id: str) -> None:
        """Remove a pool, refused (409, naming the leases) while it has current or future use."""
        self.ctx.policy.enforce(actor, f"{RULES}:delete")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            pool = _load(session, pool_id)
            holders = volume_rows.leases_holding(session, pool.id, now)
            inventory.refuse_if_held(f"volume pool {pool.id} ({pool.name})", holders)
            inventory.audit(
                session, now, actor, "volume_pool", "delete", pool.id, {"name": pool.name}
            )
            volume_rows.remove(session, pool)

    def allocations(
        self,
        actor: Actor,
        *,
        pool_id: str | None = None,
        lease_id: str | None = None,
        reservation_id: str | None = None,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[PoolAllocations]:
        """Allocations per pool from ``start`` (default now) on, a page of pools at a time; a
        caller whom the ``admin`` rule does not cover sees only their project's."""
        self.ctx.policy.enforce(actor, f"{RULES}:get_allocations", actor.owner())
        since = start or self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            if pool_id is not None:
                pools: Sequence[VolumePool] = [_load(session, pool_id)]
            else:
                pools = self._page(session, Page(page.limit, page.marker))
            rows = volume_rows.allocations(
                session,
                pool_ids=[p.id for p in pools],
                lease_id=lease_id,
                reservation_id=reservation_id,
                project_id=self.ctx.policy.scope(actor),
                start=since,
                end=end,
            )
        per_pool = inventory.grouped([p.id for p in pools], rows, lambda row: row.pool_id)
        return [PoolAllocations(p, r) for p, r in per_pool.items()]

    def _page(self, session: Session, page: Page) -> Sequence[VolumePool]:
        return inventory.page_of(
            session,
            page,
            what="volume pool",
            find=_find,
            rows=volume_rows.list_page,
            sort_keys=volume_rows.SORT_KEYS,
            cap=self.ctx.settings.max_page_size,
        )


def _find(session: Session, pool_id: str) -> VolumePool | None:
    known = inventory.parse_id(str(pool_id))
    return None if known is None else volume_rows.get(session, known)


def _load(session: Session, pool_id: str) -> VolumePool:
    pool = _find(session, pool_id)
    if pool is None:
        raise NotFound("Volume pool", pool_id)
    return pool
