"""Inventory use cases for the item kinds (devices, network segments, floating IPs, ...): create,
list, show, update, delete, allocations. One service per kind, all over the ``items`` table."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import hosts as host_rows
from climate.db import items as item_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Item
from climate.domain.actor import Actor
from climate.errors import Conflict, InvalidInput, NotFound
from climate.resources.base import text_field
from climate.resources.kinds import Kind
from climate.services import inventory


@dataclass(frozen=True)
class ItemAllocations:
    item_id: int
    reservations: list[host_rows.AllocationRow]


class ItemService:
    def __init__(self, ctx: ServiceContext, kind: Kind) -> None:
        self.ctx = ctx
        self.kind = kind
        self.rules = kind.rules

    def create(self, actor: Actor, fields: Mapping[str, Any]) -> Item:
        """Register an item: its pool and name fields, ``reservable``, and extra properties."""
        self.ctx.policy.enforce(actor, f"{self.rules}:post")
        kind = self.kind
        rest = dict(fields)
        identifying = kind.columns if kind.pool_required else (kind.name_field,)
        missing = [f for f in identifying if rest.get(f) is None]
        if missing:  # in Blazar's words
            raise InvalidInput(missing[0], f"Missing parameter {','.join(missing)}")
        name = kind.check_name(kind.name_field, rest.pop(kind.name_field))
        pool = ""
        if kind.pool_field is not None:
            value = rest.pop(kind.pool_field, None)
            if value is not None or kind.pool_required:
                pool = text_field(kind.pool_field, value)
        usable = inventory.reservable(rest)
        properties = inventory.properties(rest, creating=True)
        for key in kind.required:
            if key not in properties:
                raise InvalidInput(key, f"required for a {kind.singular}")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            if item_rows.find(session, kind.kind, pool, name) is not None:
                where = f" in {kind.pool_field} {pool}" if kind.pool_field else ""
                raise Conflict(f"{kind.name_field}: {kind.singular} {name}{where} already exists")
            item = Item(kind=kind.kind, pool=pool, name=name, created_at=now)
            if usable is not None:
                item.reservable = usable
            item_rows.add(session, item, properties)
            host_rows.bump_inventory(session)
            session.refresh(item)
            inventory.audit(session, now, actor, kind.kind, "create", item.id, dict(fields))
            return item

    def list_all(self, actor: Actor, page: Page = FIRST_PAGE) -> Sequence[Item]:
        """:raises InvalidInput: ``marker`` is not an id of this kind, or a bad ``sort_key``."""
        self.ctx.policy.enforce(actor, f"{self.rules}:get")
        with self.ctx.db.reader() as session:
            return self._page(session, page)

    def get(self, actor: Actor, item_id: str) -> Item:
        self.ctx.policy.enforce(actor, f"{self.rules}:get")
        with self.ctx.db.reader() as session:
            return self._load(session, item_id)

    def update(self, actor: Actor, item_id: str, fields: Mapping[str, Any]) -> Item:
        """Change ``reservable`` and extra properties; the pool and name identify the item."""
        self.ctx.policy.enforce(actor, f"{self.rules}:put")
        if not fields:
            raise InvalidInput("body", "no values to update")
        rest = dict(fields)
        for key in self.kind.columns:
            if key in rest:
                raise InvalidInput(key, "cannot be changed; register a new one instead")
        usable = inventory.reservable(rest)
        properties = inventory.properties(rest, creating=False)
        for key in self.kind.required:
            if key in properties and properties[key] is None:
                raise InvalidInput(key, f"required for a {self.kind.singular}")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            item = self._load(session, item_id)
            if usable is not None:
                item.reservable = usable
            item_rows.update(session, item, properties)
            host_rows.bump_inventory(session)
            item.updated_at = now
            session.flush()
            session.refresh(item)
            inventory.audit(session, now, actor, self.kind.kind, "update", item.id, dict(fields))
            return item

    def delete(self, actor: Actor, item_id: str) -> None:
        """Remove an item, refused (409, naming the leases) while it has current or future use."""
        self.ctx.policy.enforce(actor, f"{self.rules}:delete")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            item = self._load(session, item_id)
            holders = item_rows.leases_holding(session, item.id, now)
            inventory.refuse_if_held(
                f"{self.kind.singular} {item.id} ({item.name})",
                holders,
                self.kind.held.format(id=item.id),
            )
            detail = {self.kind.name_field: item.name}
            inventory.audit(session, now, actor, self.kind.kind, "delete", item.id, detail)
            item_rows.remove(session, item, session.info["lock_version"])
            host_rows.bump_inventory(session)

    def allocations(
        self,
        actor: Actor,
        *,
        item_id: str | None = None,
        lease_id: str | None = None,
        reservation_id: str | None = None,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[ItemAllocations]:
        """Allocations per item from ``start`` (default now) on, a page of items (by id) at a
        time; a caller whom the ``admin`` rule does not cover sees only their project's."""
        self.ctx.policy.enforce(actor, f"{self.rules}:get_allocations", actor.owner())
        since = start or self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            if item_id is not None:
                items: Sequence[Item] = [self._load(session, item_id)]
            else:
                items = self._page(session, Page(page.limit, page.marker))
            rows = item_rows.allocations(
                session,
                self.kind.kind,
                item_ids=[i.id for i in items],
                lease_id=lease_id,
                reservation_id=reservation_id,
                project_id=self.ctx.policy.scope(actor),
                start=since,
                end=end,
            )
        per_item = inventory.grouped([i.id for i in items], rows, lambda row: row.host_id)
        return [ItemAllocations(i, r) for i, r in per_item.items()]

    def _page(self, session: Session, page: Page) -> Sequence[Item]:
        return inventory.page_of(
            session,
            page,
            what=self.kind.singular,
            find=self._find,
            rows=functools.partial(item_rows.list_page, kind=self.kind.kind),
            sort_keys=item_rows.SORT_KEYS,
            cap=self.ctx.settings.max_page_size,
        )

    def _find(self, session: Session, item_id: str) -> Item | None:
        known = inventory.parse_id(str(item_id))
        return None if known is None else item_rows.get(session, self.kind.kind, known)

    def _load(self, session: Session, item_id: str) -> Item:
        item = self._find(session, item_id)
        if item is None:
            singular = self.kind.singular
            raise NotFound(singular[0].upper() + singular[1:], item_id, f"{self.kind.key}_id")
        return item
