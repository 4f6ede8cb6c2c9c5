"""This process's copy of the reservable items of each kind (``resources/items.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from climate.db import hosts as host_rows
from climate.db import items as item_rows
from climate.db.items import ItemRecord
from climate.planner.calendar import HostSet
from climate.planner.query import parse_query

MAX_REMEMBERED_QUERIES = 1024


class ItemInventory:
    """This process's copy of the reservable items of one kind, reloaded when the inventory
    version moves (it covers hosts and items alike); items matching a query are remembered."""

    def __init__(self, kind: str, queryable: Callable[[ItemRecord], Mapping[str, Any]]) -> None:
        self.kind = kind
        self.queryable = queryable
        """What a query sees of an item (``Kind.queryable``)."""
        self._lock = threading.Lock()
        self._version = -1
        self._records: list[ItemRecord] = []
        self._matches: dict[tuple[str, ...], HostSet] = {}

    def matching(self, session: Session, *queries: str, pool: str | None = None) -> HostSet:
        """The reservable items in ``pool`` (any, for None) matching every query."""
        version = host_rows.inventory_version(session)
        key = (pool or "", str(pool is None), *queries)
        with self._lock:
            if version != self._version:
                self._records = item_rows.reservable_records(session, self.kind)
                self._matches = {}
                self._version = version
            found = self._matches.get(key)
            if found is None:
                parsed = [parse_query("resource_properties", q) for q in queries]
                found = HostSet(
                    (r.id, r.name)
                    for r in self._records
                    if (pool is None or r.pool == pool)
                    and all(q.matches(self.queryable(r)) for q in parsed)
                )
                if len(self._matches) > MAX_REMEMBERED_QUERIES:
                    self._matches.clear()
                self._matches[key] = found
            return found
