"""What an item type's kind of item is: its rows, its inventory's routes and its look on the
wire. Item types declare theirs (``items.py``); the API and the services read them through
``capabilities.item_kinds``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from climate.db import items as item_rows
from climate.resources.wire_fields import Schema


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind of item: its rows in ``items``, its inventory's routes and how its items look on
    the wire. An ``ItemType`` declares its own; nothing outside ``resources/`` names one."""

    kind: str
    """``items.kind``."""
    resource_type: str
    singular: str
    plural: str
    path: str
    """Its inventory's path under /v1, which is also the key of its list."""
    key: str
    """The key of one item in an answer (``{"device": {...}}``)."""
    model: str
    """The name of its models in the API's document (``Device``, ``DeviceCreate``, ...)."""
    rules: str
    """The prefix of its policy rules (``…:get``, ``…:post``, ``…:put``, ``…:delete``,
    ``…:get_allocations``)."""
    name_field: str
    """The wire field stored in ``items.name`` (unique within the pool)."""
    check_name: Callable[[str, object], str]
    fields: Mapping[str, Schema] = field(hash=False)
    """JSON schemas of the fields a new item is registered with, for the document: its pool and
    name fields, and the extra properties it is known by."""
    example: Mapping[str, Any] = field(hash=False)
    """A new item, for the document."""
    pool_field: str | None = None
    """The wire field stored in ``items.pool`` (None: the kind has no pools)."""
    pool_required: bool = False
    """A new item must name its pool."""
    required: tuple[str, ...] = ()
    """Extra properties every item of the kind must have."""
    shown: tuple[str, ...] = ()
    """Extra properties every item shows, null when it has none, as Blazar shows its columns."""
    held: str = ""
    """Blazar's words refusing to delete an item that reservations hold (``{id}``: the item's),
    for a kind Blazar has; they begin the 409's message."""
    shrunk: str = ""
    """Blazar's words refusing to take items from an active reservation, for a kind Blazar has;
    they begin the message, and the answer is Blazar's 400 rather than a 409."""
    columns: tuple[str, ...] = field(init=False)
    """The fields that are not extra properties."""

    def __post_init__(self) -> None:
        own = (self.name_field,) if self.pool_field is None else (self.pool_field, self.name_field)
        object.__setattr__(self, "columns", own)

    def queryable(self, record: item_rows.ItemRecord) -> dict[str, str | int | None]:
        """The properties a reservation's query sees: pool and name under their wire names,
        and every extra property."""
        found: dict[str, str | int | None] = dict(record.properties)
        found[self.name_field] = record.name
        if self.pool_field is not None:
            found[self.pool_field] = record.pool
        return found
