"""Request bodies that their services read field by field (inventories, availability searches,
series, leases from a template): the models state the accepted shapes for the document, the
services check them with their own messages (named fields, Blazar's words where Blazar has them).
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, create_model

from climate.api.schemas import DURATION, REQUEST_DATE, component, nullable
from climate.api.schemas.hosts import EXTRA_VALUE
from climate.db.tables import NAME_LENGTH, PROPERTY_NAME_LENGTH
from climate.domain.lease_rules import MAX_REMINDERS
from climate.domain.requests import Conflicts
from climate.domain.status import LeaseType
from climate.resources.kinds import Kind
from climate.services.availability import MAX_STEP, MAX_WINDOWS
from climate.services.hosts import MAX_INT
from climate.services.series import MAX_OCCURRENCES, NAME_ROOM

INTEGER_STRING: dict[str, Any] = {"type": "string", "pattern": r"^\s*[0-9]{1,18}\s*$"}
START: dict[str, Any] = {"anyOf": [{"const": "now"}, REQUEST_DATE]}
PROPERTY_NAMES: dict[str, Any] = {
    "minLength": 1,
    "maxLength": PROPERTY_NAME_LENGTH,
    "not": {"enum": ["id", "created_at", "updated_at"]},
}
CAPACITY: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_INT}, INTEGER_STRING]
}


Boolean = Annotated[Any, WithJsonSchema({"type": "boolean"})]
Text = Annotated[Any, WithJsonSchema({"type": "string"})]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _extensible(**extra: Any) -> ConfigDict:
    return ConfigDict(extra="allow", json_schema_extra=extra)


# -- inventories ----------------------------------------------------------------------------


@cache
def item_create(kind: Kind) -> type[BaseModel]:
    """A new item of ``kind``: the fields its kind describes (required: the name, the pool if
    the kind says so, the properties it requires), any other extra properties."""
    required = {kind.name_field, *kind.required, *(kind.columns if kind.pool_required else ())}
    fields: dict[str, Any] = {
        field: (Annotated[Any, WithJsonSchema(dict(schema))], ... if field in required else None)
        for field, schema in kind.fields.items()
    }
    fields |= {key: (Text, ...) for key in kind.required if key not in kind.fields}
    return create_model(
        f"{kind.model}Create",
        __config__=_extensible(
            additionalProperties=EXTRA_VALUE,
            propertyNames=PROPERTY_NAMES,
            examples=[dict(kind.example)],
        ),
        **fields,
        reservable=(Boolean, None),
    )


class ItemUpdate(BaseModel):
    """Extra properties (null removes one) and reservable; the fields that identify the item
    cannot change."""

    model_config = _extensible(
        additionalProperties=nullable(EXTRA_VALUE),
        propertyNames=PROPERTY_NAMES,
        minProperties=1,
        examples=[{"model": "h100"}],
    )

    reservable: Boolean = None


class VolumePoolCreate(BaseModel):
    model_config = _extensible(
        additionalProperties=EXTRA_VALUE,
        propertyNames=PROPERTY_NAMES,
        examples=[{"name": "ssd-1", "capacity_gb": 10000, "tier": "ssd"}],
    )

    name: Annotated[
        Any, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S"})
    ]
    capacity_gb: Annotated[Any, WithJsonSchema(CAPACITY)]
    reservable: Boolean = None


class VolumePoolUpdate(BaseModel):
    """A smaller capacity is refused (409) while reservations need more."""

    model_config = _extensible(
        additionalProperties=nullable(EXTRA_VALUE),
        propertyNames={**PROPERTY_NAMES, "not": {"enum": ["id", "name", "created_at"]}},
        minProperties=1,
        examples=[{"capacity_gb": 20000}],
    )

    capacity_gb: Annotated[Any, WithJsonSchema(CAPACITY)] = None
    reservable: Boolean = None


# -- searches, series, templates ------------------------------------------------------------


class AvailabilitySearch(Body):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "reservations": [
                        {
                            "resource_type": "physical:host",
                            "min": 8,
                            "max": 8,
                            "resource_properties": '["==", "$gpu", "a100"]',
                        }
                    ],
                    "duration": "48:00",
                    "search_start": "now",
                    "search_end": "2031-06-30 00:00",
                }
            ]
        },
    )

    reservations: Annotated[
        Any,
        WithJsonSchema({"type": "array", "minItems": 1, "items": component("ReservationCreate")}),
    ]
    duration: Annotated[
        Any,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "integer", "minimum": 1},
                    {"type": "string", "pattern": r"^\s*([0-9]{1,18}|[0-9]{1,6}:[0-5][0-9])\s*$"},
                ],
                "description": "seconds, or 'HH:MM'",
            }
        ),
    ]
    search_start: Annotated[Any, WithJsonSchema(START)] = None
    search_end: Annotated[Any, WithJsonSchema(REQUEST_DATE)]
    limit: Annotated[int, Field(ge=1, le=MAX_WINDOWS)] = 3
    step: Annotated[int, Field(ge=1, le=MAX_STEP)] = Field(
        60, description="window starts are multiples of this many seconds"
    )


NoEvents = Annotated[
    Any, WithJsonSchema({"type": "array", "maxItems": 0, "description": "user-defined events: []"})
]
Reminders = Annotated[
    Any,
    WithJsonSchema(
        {
            "type": "array",
            "maxItems": MAX_REMINDERS,
            "items": DURATION,
            "description": "extra notifications (lease.before_end), each this long before the end",
        }
    ),
]


class SeriesCreate(Body):
    __doc__ = (
        f"A lease per occurrence, at most {MAX_OCCURRENCES}; end_date (of the first occurrence) "
        "or duration."
    )

    name: Annotated[Any, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": NAME_ROOM})]
    start_date: Annotated[Any, WithJsonSchema(REQUEST_DATE)]
    end_date: Annotated[Any, WithJsonSchema(REQUEST_DATE)] = None
    duration: Annotated[Any, WithJsonSchema(DURATION)] = None
    rrule: str = Field(
        description="an iCalendar RRULE value with COUNT or UNTIL, e.g. "
        "'FREQ=WEEKLY;BYDAY=TU;COUNT=8' (docs/series.md)"
    )
    exdates: Annotated[
        Any, WithJsonSchema({"type": "array", "maxItems": MAX_OCCURRENCES, "items": REQUEST_DATE})
    ] = None
    conflicts: Annotated[
        Any, WithJsonSchema({"type": "string", "enum": [c.value for c in Conflicts]})
    ] = None
    reservations: Annotated[
        Any,
        WithJsonSchema(
            {"type": "array", "minItems": 1, "items": component("AnyReservationCreate")}
        ),
    ]
    events: NoEvents = None
    before_end_offset: Annotated[Any, WithJsonSchema(DURATION)] = None
    reminders: Reminders = None


class LeaseFromTemplate(Body):
    """One lease for a Heat stack: servers by flavor, volumes (and servers' block device
    mapping volumes) by size, floating IPs by network, resource groups times their count,
    nested stacks from files (docs/resources.md, Stacks)."""

    name: Annotated[
        Any, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": NAME_LENGTH})
    ]
    start_date: Annotated[Any, WithJsonSchema(START)] = None
    end_date: Annotated[Any, WithJsonSchema(REQUEST_DATE)]
    before_end_date: Annotated[Any, WithJsonSchema(nullable(REQUEST_DATE))] = None
    events: NoEvents = None
    lease_type: Annotated[
        Any, WithJsonSchema({"type": "string", "enum": [t.value for t in LeaseType]})
    ] = None
    priority: Annotated[
        Any, WithJsonSchema({"type": "integer", "description": "waiting queue priority"})
    ] = None
    retries: Annotated[Any, WithJsonSchema({"type": "integer", "minimum": 1})] = None
    deadline: Annotated[Any, WithJsonSchema(REQUEST_DATE)] = None
    hold: Annotated[Any, WithJsonSchema(component("Hold"))] = None
    hold_minutes: Annotated[Any, WithJsonSchema({"type": "integer", "minimum": 1})] = None
    template: str = Field(description="a Heat (HOT) template's YAML text")
    parameters: Annotated[
        Any,
        WithJsonSchema(
            {
                "type": "object",
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                "description": "values of the template's parameters (else their defaults)",
            }
        ),
    ] = None
    files: Annotated[
        Any,
        WithJsonSchema(
            {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "nested templates by the name the template uses (a resource type "
                "such as server.yaml, or OS::Heat::Stack's get_file), as in Heat's API",
            }
        ),
    ] = None
