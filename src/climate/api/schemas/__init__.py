"""The wire's request models (pydantic v2): what a route validates and what the OpenAPI
document says its body is, from one definition.

Blazar's loose inputs (its date formats and ``"now"``, durations, string booleans and
integers) are ``Annotated`` types here, each validated by the parser of ``api/parsing.py``.
A route reads its body with ``validated`` (the raw body keeps its size limit, duplicate-key
and control-character checks) and declares it with ``openapi_extra=body(Model)``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Sequence
from typing import Annotated, Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, PlainValidator, ValidationError, ValidationInfo, WithJsonSchema

from climate import inputs
from climate.api import parsing
from climate.errors import InvalidInput

_COMPONENT = "x-climate-component"
Model = TypeVar("Model", bound=BaseModel)
BODIES: dict[str, type[BaseModel]] = {}
"""Every request model a route declared, by name: components of the OpenAPI document of an app
that has the route (an app leaves out the inventories of resource types it does not have)."""

REQUEST_DATE: dict[str, Any] = {
    "type": "string",
    "pattern": r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}",
    "description": "'YYYY-MM-DD HH:MM' (UTC) or ISO 8601; before year 9000",
}
DURATION: dict[str, Any] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "description": "seconds, 'HH:MM' or an ISO 8601 duration such as 'PT2H' or 'P1DT12H'",
}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _field(info: ValidationInfo) -> str:
    return info.field_name or "body"


def _date(value: object, info: ValidationInfo) -> dt.datetime:
    return parsing.parse_date(_field(info), value)


def _date_or_now(value: object, info: ValidationInfo) -> dt.datetime | None:
    return None if value in ("now", None) else parsing.parse_date(_field(info), value)


def _optional_date(value: object, info: ValidationInfo) -> dt.datetime | None:
    return parsing.optional_date(_field(info), value)


def _duration(value: object, info: ValidationInfo) -> dt.timedelta:
    return parsing.parse_duration(_field(info), value)


def _durations(value: object, info: ValidationInfo) -> tuple[dt.timedelta, ...] | None:
    return parsing.durations(_field(info), value)


def _optional_duration(value: object, info: ValidationInfo) -> dt.timedelta | None:
    return None if value is None else parsing.parse_duration(_field(info), value)


def _flag(value: object, info: ValidationInfo) -> bool:
    return parsing.flag(_field(info), value)


def _signed(value: object, info: ValidationInfo) -> int | None:
    """A signed integer or a string of digits (its service checks the range that makes sense)."""
    return None if value is None else inputs.integer(_field(info), value, minimum=-inputs.MAX_INT)


def _no_events(value: object, info: ValidationInfo) -> list[Any]:
    if value is not None and value != []:
        raise InvalidInput(_field(info), "user-defined events are not supported; send []")
    return []


RequestDate = Annotated[dt.datetime, PlainValidator(_date), WithJsonSchema(REQUEST_DATE)]
StartDate = Annotated[
    dt.datetime | None,
    PlainValidator(_date_or_now),
    WithJsonSchema({"anyOf": [{"const": "now"}, REQUEST_DATE]}),
]
"""A start: a date, or ``"now"`` (None)."""
OptionalDate = Annotated[
    dt.datetime | None, PlainValidator(_optional_date), WithJsonSchema(nullable(REQUEST_DATE))
]
Duration = Annotated[dt.timedelta, PlainValidator(_duration), WithJsonSchema(DURATION)]
OptionalDuration = Annotated[
    dt.timedelta | None, PlainValidator(_optional_duration), WithJsonSchema(nullable(DURATION))
]
Flag = Annotated[
    bool,
    PlainValidator(_flag),
    WithJsonSchema({"type": "boolean", "description": "also 'true'/'false', '1'/'0', 'yes'/'no'"}),
]
SignedInt = Annotated[int | None, PlainValidator(_signed), WithJsonSchema({"type": "integer"})]
NoEvents = Annotated[
    list[Any],
    PlainValidator(_no_events),
    WithJsonSchema({"type": "array", "maxItems": 0, "description": "user-defined events: []"}),
]


def durations(max_items: int) -> Any:
    """A list of durations, each named by its index in an error (``reminders[2]``)."""
    schema = nullable({"type": "array", "maxItems": max_items, "items": DURATION})
    return Annotated[
        tuple[dt.timedelta, ...] | None, PlainValidator(_durations), WithJsonSchema(schema)
    ]


def component(name: str) -> dict[str, Any]:
    """A reference to a component not (yet) made from a model: pydantic resolves every
    ``$ref`` it sees, so ``schemas()`` writes it."""
    return {_COMPONENT: name}


def schemas(bodies: Collection[str], *also: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """The JSON schemas of the request models named in ``bodies``, of the models ``also`` and of
    the models they nest, as components."""
    found: dict[str, dict[str, Any]] = {}
    declared = [model for name, model in BODIES.items() if name in bodies]
    for model in (*declared, *also):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        found.update(schema.pop("$defs", {}))
        found[model.__name__] = schema
    written: dict[str, dict[str, Any]] = json.loads(components(json.dumps(found)))
    return written


def components(text: str) -> str:
    """``text`` (JSON) with each ``component`` written as the reference it stands for."""
    return text.replace(f'{{"{_COMPONENT}": "', '{"$ref": "#/components/schemas/')


def body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is ``model``."""
    BODIES[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}
    }


def validated(model: type[Model], raw: bytes | dict[str, Any]) -> Model:
    """``raw`` (a body, or an object already decoded) as ``model``.

    :raises RequestValidationError: pydantic's errors (rendered by ``error_message``).
    :raises InvalidInput: a parser's error, naming the field.
    """
    fields = parsing.json_object(raw) if isinstance(raw, bytes) else raw
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def error_message(errors: Sequence[Any]) -> str:
    """The first error as Blazar words it (``Missing parameter end_date``), else the field
    named as everywhere in Climate: ``reservations[0].min: <problem>``."""
    first = errors[0]
    field = location(first.get("loc", ()))
    if first.get("type") == "missing":
        return f"Missing parameter {field}"
    if first.get("type") == "extra_forbidden":
        return f"{field}: unknown field"
    return f"{field or 'request'}: {first.get('msg')}"


def location(loc: Sequence[int | str]) -> str:
    """A pydantic location as a field path; FastAPI's ``body``/``query``/``path`` dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("body", "query", "path"):
            path += f".{part}" if path else str(part)
    return path
