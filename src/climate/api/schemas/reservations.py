"""Reservations on the wire, one model per resource type and three per reservation: as asked
(``…ReservationCreate``), as changed (``…ReservationUpdate``) and as shown (``…Reservation``,
as ``wire.reservation`` renders it). ``AnyReservation…`` is the union of the installed resource
types' models, discriminated by ``resource_type``.

Each resource type checks its own fields (``resources/*``, with their messages); these models
state them for the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema, create_model

from climate.api.schemas import nullable
from climate.api.schemas.shapes import LeaseDate, NumericId, Positive, Record, Stamp, Uuid, one_of
from climate.domain.status import EndPolicy, ReservationStatus, StartPolicy
from climate.resources import load_resource_types
from climate.resources.base import ResourceType
from climate.resources.items import MAX_REQUIRED

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


class ReservationAllocation(Record):
    resource_id: NumericId
    start_date: LeaseDate
    end_date: LeaseDate


class InstanceAllocation(ReservationAllocation):
    count: Positive


@dataclass(frozen=True)
class WireFields:
    """A resource type's reservation fields: as asked (JSON schemas; ``required`` of them in a
    new reservation) and as stored and shown."""

    model: str
    asked: dict[str, Schema]
    shown: dict[str, Schema]
    required: tuple[str, ...] = ()
    allocation: type[BaseModel] = ReservationAllocation
    description: str | None = None
    extra_shown: dict[str, Schema] = field(default_factory=dict)


_INSTANCE_HOSTS: Schema = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "host_id": {"type": "string", "pattern": "^[0-9]+$"},
            "count": POSITIVE,
        },
        "required": ["host_id", "count"],
        "additionalProperties": False,
    },
}
FIELDS: dict[str, WireFields] = {
    "physical:host": WireFields(
        model="",
        asked={
            "min": COUNT,
            "max": COUNT,
            "count_range": {"type": "string", "pattern": r"^[0-9]+(-[0-9]+)?$"},
            "hypervisor_properties": QUERY,
            "resource_properties": QUERY,
        },
        shown={
            "min": POSITIVE,
            "max": POSITIVE,
            "hypervisor_properties": STRING,
            "resource_properties": STRING,
        },
        description="min and max are required, directly or through count_range",
    ),
    "device": WireFields(
        model="Device",
        asked={"min": COUNT, "max": COUNT, "resource_properties": QUERY},
        shown={"min": POSITIVE, "max": POSITIVE, "resource_properties": STRING},
        required=("min", "max"),
    ),
    "network": WireFields(
        model="Network",
        asked={"amount": COUNT, "network_properties": QUERY, "resource_properties": QUERY},
        shown={"amount": POSITIVE, "network_properties": STRING, "resource_properties": STRING},
    ),
    "virtual:floatingip": WireFields(
        model="FloatingIP",
        asked={
            "network_id": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
            "amount": COUNT,
            "required_floatingips": {
                "type": "array",
                "maxItems": MAX_REQUIRED,
                "uniqueItems": True,
                "items": STRING,
                "description": "addresses of the network that must be among those reserved",
            },
        },
        shown={
            "network_id": STRING,
            "amount": POSITIVE,
            "required_floatingips": {"type": "array", "items": STRING},
        },
        required=("network_id",),
    ),
    "virtual:volume": WireFields(
        model="Volume",
        asked={
            "size_gb": COUNT,
            "amount": COUNT,
            "pool": nullable({"type": "string", "maxLength": 255}),
            "resource_properties": QUERY,
        },
        shown={
            "size_gb": POSITIVE,
            "amount": POSITIVE,
            "pool": nullable(STRING),
            "resource_properties": STRING,
        },
        required=("size_gb",),
    ),
    "virtual:instance": WireFields(
        model="Instance",
        asked={
            "amount": COUNT,
            "vcpus": COUNT,
            "memory_mb": COUNT,
            "disk_gb": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": "^[0-9]+$"},
                ]
            },
            "affinity": {
                "anyOf": [{"type": "boolean"}, {"type": "null"}, {"type": "string"}],
                "description": "true: all on one host; false: each on its own; null: anywhere "
                '(also "True", "False", "None")',
            },
            "resource_properties": QUERY,
        },
        shown={
            "amount": POSITIVE,
            "vcpus": POSITIVE,
            "memory_mb": POSITIVE,
            "disk_gb": {"type": "integer", "minimum": 0},
            "affinity": nullable({"type": "boolean"}),
            "resource_properties": STRING,
            "flavor_id": {"type": "string", "description": "the reservation's private flavor"},
            "aggregate_id": {"type": "string", "description": "the aggregate of its hosts"},
            "server_group_id": nullable({"type": "string", "format": "uuid"}),
            "hosts": _INSTANCE_HOSTS,
        },
        required=("amount", "vcpus", "memory_mb", "disk_gb"),
        allocation=InstanceAllocation,
    ),
}
"""By resource type name, in the order the document lists them."""


def _described(schema: Schema) -> Any:
    return Annotated[Any, WithJsonSchema(schema)]


def _end_policies(resource_type: ResourceType) -> list[str]:
    return [p.value for p in EndPolicy if p in resource_type.end_policies]


def _asked(resource_type: ResourceType, wire: WireFields) -> dict[str, Any]:
    """A reservation's fields in a request, policies included (docs/policies.md)."""
    before_end = {"type": "string", "enum": sorted(resource_type.before_end_actions)}
    start_policy = {"type": "string", "enum": [p.value for p in StartPolicy]}
    end_policy = {"type": "string", "enum": _end_policies(resource_type)}
    return {
        **{
            name: (_described(schema), ... if name in wire.required else None)
            for name, schema in wire.asked.items()
        },
        "before_end": (_described(before_end), None),
        "start_policy": (
            _described(
                {
                    **nullable(start_policy),
                    "description": "auto (default): the backend starts the workload; manual: "
                    "it holds the resources until POST .../reservations/{id}/start",
                }
            ),
            None,
        ),
        "end_policy": (
            _described(
                {
                    **nullable(end_policy),
                    "description": "what the end does with the workload (release by default); "
                    "the resources go back to the pool whatever it is",
                }
            ),
            None,
        ),
    }


def _shown(resource_type: ResourceType, wire: WireFields) -> dict[str, Any]:
    """A reservation as ``wire.reservation`` renders it: every field present."""
    before_end = sorted(resource_type.before_end_actions)
    return {
        "id": (Uuid, ...),
        "lease_id": (Uuid, ...),
        "status": (Annotated[str, one_of(*ReservationStatus)], ...),
        "missing_resources": (bool, ...),
        "resources_changed": (bool, ...),
        "resource_id": (str, ...),
        "resource_type": (Literal[resource_type.name], ...),
        **{name: (_described(schema), ...) for name, schema in wire.shown.items()},
        "before_end": (Annotated[str, one_of(*before_end)], ...),
        "start_policy": (Annotated[str, one_of(*StartPolicy)], ...),
        "end_policy": (Annotated[str, one_of(*_end_policies(resource_type))], ...),
        "started_at": (
            LeaseDate | None,
            Field(description="when its project started a manual reservation"),
        ),
        "acknowledged": (
            bool | None,
            Field(
                description="keep-until-ack: whether its project acknowledged the end; null "
                "for other end policies"
            ),
        ),
        "acknowledged_at": (LeaseDate | None, ...),
        "allocations": (list[wire.allocation], ...),  # type: ignore[name-defined]
        "created_at": (Stamp, ...),
        "updated_at": (Stamp | None, ...),
    }


@dataclass(frozen=True)
class ReservationModels:
    create: type[BaseModel]
    update: type[BaseModel]
    shown: type[BaseModel]


def models_of(resource_type: ResourceType) -> ReservationModels:
    """A resource type's three reservation models."""
    wire = FIELDS[resource_type.name]
    kind: Any = Literal[resource_type.name]
    asked = _asked(resource_type, wire)
    create = create_model(
        f"{wire.model}ReservationCreate",
        __config__=ConfigDict(extra="forbid", json_schema_extra=_about(wire.description)),
        resource_type=(kind, ...),
        **asked,
    )
    changes: dict[str, Any] = {
        "id": (str | None, Field(None, description="required when the lease has several")),
        "resource_type": (kind | None, None),
        **{name: (annotation, None) for name, (annotation, _) in asked.items()},
    }
    update = create_model(
        f"{wire.model}ReservationUpdate", __config__=ConfigDict(extra="forbid"), **changes
    )
    shown = create_model(f"{wire.model}Reservation", __base__=Record, **_shown(resource_type, wire))
    return ReservationModels(create, update, shown)


def _about(description: str | None) -> dict[str, Any]:
    return {} if description is None else {"description": description}


@cache
def unions() -> tuple[type[BaseModel], type[BaseModel], type[BaseModel]]:
    """``AnyReservationCreate``, ``AnyReservationUpdate`` and ``AnyReservation``: the
    installed resource types' models (discriminated by ``resource_type`` where it is required)."""
    installed = load_resource_types()
    found = [models_of(installed[name]) for name in FIELDS if name in installed]
    creates = Union[tuple(m.create for m in found)]  # type: ignore[valid-type]  # noqa: UP007
    updates = Union[tuple(m.update for m in found)]  # type: ignore[valid-type]  # noqa: UP007
    shown = Union[tuple(m.shown for m in found)]  # type: ignore[valid-type]  # noqa: UP007
    one = "one reservation; its resource_type says which fields it has"
    return (
        _root(
            "AnyReservationCreate", Annotated[creates, Field(discriminator="resource_type")], one
        ),
        _root(
            "AnyReservationUpdate",
            updates,
            "changes to one reservation, of the fields of its resource_type",
        ),
        _root("AnyReservation", Annotated[shown, Field(discriminator="resource_type")], one),
    )


def _root(name: str, annotation: Any, description: str) -> type[BaseModel]:
    model: type[BaseModel] = create_model(
        name,
        __base__=RootModel[annotation],
        __doc__=description,
    )
    return model
