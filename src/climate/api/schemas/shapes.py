"""The wire's value types as ``wire.py`` renders them, for response models: dates with
microseconds, timestamps, ids, and records that have exactly their keys."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

LEASE_DATE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}$"
STAMP = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$"

LeaseDate = Annotated[str, Field(pattern=LEASE_DATE)]
"""A lease's dates, its events' times: ISO 8601 with microseconds, UTC, no offset."""
Stamp = Annotated[str, Field(pattern=STAMP)]
"""``created_at`` and ``updated_at``: to the second, a space between date and time."""
Uuid = Annotated[str, WithJsonSchema({"type": "string", "format": "uuid"})]
NumericId = Annotated[str, Field(pattern="^[0-9]+$")]
"""An inventory row's id (hosts, items, pools), as a string."""
Positive = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]


def one_of(*values: object, **extra: Any) -> Any:
    """A string among ``values`` (an enum's members, as ``wire.py`` writes them)."""
    strings = [str(getattr(v, "value", v)) for v in values]
    return WithJsonSchema({"type": "string", "enum": strings, **extra})


class Record(BaseModel):
    """A rendered object: every field present (null where none), no other key."""

    model_config = ConfigDict(extra="forbid")


class Extensible(BaseModel):
    """A rendered inventory row: its fields, then its extra properties as strings."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "additionalProperties": {"type": "string", "description": "extra properties"}
        },
    )
