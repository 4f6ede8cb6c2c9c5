"""Reservations on the wire, one model per resource type and three per reservation: as asked
(``…ReservationCreate``), as changed (``…ReservationUpdate``) and as shown (``…Reservation``,
as ``wire.reservation`` renders it). ``AnyReservation…`` is the union of the service's resource
types' models, discriminated by ``resource_type``.

Each resource type supplies its fields (``ResourceType.wire``, resources/wire_fields.py) and
checks them itself (``validate``, with its messages); these models state them for the document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema, create_model

from climate.api.schemas import nullable
from climate.api.schemas.shapes import LeaseDate, NumericId, Positive, Record, Stamp, Uuid, one_of
from climate.domain.status import EndPolicy, ReservationStatus, StartPolicy
from climate.resources.base import ResourceType
from climate.resources.wire_fields import WireFields


class ReservationAllocation(Record):
    resource_id: NumericId
    start_date: LeaseDate
    end_date: LeaseDate


class InstanceAllocation(ReservationAllocation):
    count: Positive


def _described(schema: dict[str, Any]) -> Any:
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
    allocation = InstanceAllocation if wire.counted else ReservationAllocation
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
        "allocations": (list[allocation], ...),  # type: ignore[valid-type]
        "created_at": (Stamp, ...),
        "updated_at": (Stamp | None, ...),
    }


@dataclass(frozen=True)
class ReservationModels:
    create: type[BaseModel]
    update: type[BaseModel]
    shown: type[BaseModel]


def models_of(resource_type: ResourceType, wire: WireFields) -> ReservationModels:
    """A resource type's three reservation models, from the fields it supplies."""
    kind: Any = Literal[resource_type.name]
    asked = _asked(resource_type, wire)
    create = create_model(
        f"{wire.model}ReservationCreate",
        # Other keys are ignored, not refused (``ResourceType.fields``): Blazar ignores them.
        __config__=ConfigDict(extra="ignore", json_schema_extra=_about(wire.description)),
        resource_type=(kind, ...),
        **asked,
    )
    changes: dict[str, Any] = {
        "id": (str | None, Field(None, description="required when the lease has several")),
        "resource_type": (kind | None, None),
        **{name: (annotation, None) for name, (annotation, _) in asked.items()},
    }
    update = create_model(
        f"{wire.model}ReservationUpdate", __config__=ConfigDict(extra="ignore"), **changes
    )
    shown = create_model(f"{wire.model}Reservation", __base__=Record, **_shown(resource_type, wire))
    return ReservationModels(create, update, shown)


def _about(description: str | None) -> dict[str, Any]:
    return {} if description is None else {"description": description}


def unions(
    resource_types: Mapping[str, ResourceType],
) -> tuple[type[BaseModel], type[BaseModel], type[BaseModel]]:
    """``AnyReservationCreate``, ``AnyReservationUpdate`` and ``AnyReservation``: the models of
    ``resource_types`` (discriminated by ``resource_type`` where it is required)."""
    found = [models_of(t, t.wire) for _, t in sorted(resource_types.items()) if t.wire is not None]
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
