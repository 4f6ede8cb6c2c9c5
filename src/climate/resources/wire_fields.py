"""How a resource type's reservation fields look on the wire, for the API's document: each
type supplies its own (``ResourceType.wire``), and ``api/schemas/reservations.py`` makes its
models, and the union of them all, from it. The type's ``validate`` still checks the fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]
INTEGER_STRING: Schema = {"type": "string", "pattern": r"^\s*[0-9]{1,18}\s*$"}
COUNT: Schema = {
    "anyOf": [{"type": "integer", "minimum": 1}, INTEGER_STRING],
    "description": "an integer, or an integer string as the blazar CLI sends",
}
QUERY: Schema = {
    "anyOf": [{"type": "string"}, {"type": "array"}],
    "description": 'a property query such as \'["==", "$gpu", "a100"]\'; "" matches every host',
}
POSITIVE: Schema = {"type": "integer", "minimum": 1}
STRING: Schema = {"type": "string"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


@dataclass(frozen=True)
class WireFields:
    """A reservation's own fields (its policies and ``before_end`` come from the type's
    ``end_policies`` and ``before_end_actions``)."""

    model: str
    """The models' name prefix: ``{model}ReservationCreate``, ``…Update``, ``…Reservation``."""
    asked: dict[str, Schema]
    """As a request gives them (JSON schemas)."""
    shown: dict[str, Schema]
    """As ``wire.reservation`` shows them (all present)."""
    required: tuple[str, ...] = ()
    """Of ``asked``, those a new reservation must give."""
    counted: bool = False
    """Its allocations carry a ``count`` (instances per host)."""
    description: str | None = None
