"""What the item and volume pool inventories share: checking extra properties and ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from climate.db.tables import PROPERTY_NAME_LENGTH, PROPERTY_VALUE_LENGTH
from climate.errors import InvalidInput

MAX_INT = 2**31 - 1
READ_ONLY = frozenset({"id", "created_at", "updated_at"})


def parse_id(text: str) -> int | None:
    """An inventory id (an unsigned 32-bit integer), or None: an unknown id, not an error."""
    if text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_INT:
        return int(text)
    return None


def reservable(fields: dict[str, Any]) -> bool | None:
    """``reservable`` taken out of ``fields`` (None when absent)."""
    if "reservable" not in fields:
        return None
    value = fields.pop("reservable")
    if not isinstance(value, bool):
        raise InvalidInput("reservable", "must be true or false")
    return value


def properties(fields: Mapping[str, Any], *, creating: bool) -> dict[str, str | None]:
    """Extra properties as text; None removes one (on update only)."""
    found: dict[str, str | None] = {}
    for key, value in fields.items():
        if not isinstance(key, str) or not key or len(key) > PROPERTY_NAME_LENGTH:
            raise InvalidInput(
                "properties", f"property names are 1 to {PROPERTY_NAME_LENGTH} characters"
            )
        if key in READ_ONLY:
            raise InvalidInput(key, "cannot be set")
        if value is None:
            if creating:
                raise InvalidInput(key, "a new property needs a value")
            found[key] = None
            continue
        if not isinstance(value, str | int | float | bool):
            raise InvalidInput(key, "must be a string or a number")
        text = str(value)
        if len(text) > PROPERTY_VALUE_LENGTH:
            raise InvalidInput(key, f"at most {PROPERTY_VALUE_LENGTH} characters")
        found[key] = text
    return found
