"""The OpenAPI document: every route's request body and every response it can give, in one place.

Routes read raw bodies (Blazar's loose JSON, parsed by ``parsing.py``) and answer with shapes
rendered by ``wire.py``, so FastAPI cannot infer either. ``OPERATIONS`` states them per method and
path, ``SCHEMAS`` holds the shapes, and ``install`` merges both into FastAPI's generated document
(which still contributes the path and query parameters).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from climate.api.schemas import components
from climate.api.schemas import schemas as request_models
from climate.api.schemas.answers import CREATES
from climate.db.tables import PROPERTY_VALUE_LENGTH
from climate.domain.status import (
    EndPolicy,
    ReservationStatus,
    StartPolicy,
)
from climate.resources.base import ResourceType
from climate.resources.hosts import PhysicalHostType
from climate.resources.instances import InstanceType
from climate.resources.items import (
    MAX_REQUIRED,
    DeviceType,
    FloatingIPType,
    NetworkType,
)
from climate.resources.volumes import VolumeType
from climate.services.hosts import MAX_INT

JsonSchema = dict[str, Any]

ERROR_MEANINGS = {
    400: "a field is missing, malformed or out of range (the message names it)",
    401: "no identity, or an unknown, expired or revoked token",
    403: "a policy rule refuses this caller",
    404: "no such resource (or one of another project)",
    409: "valid, but the current state refuses it",
    413: "the request body is larger than max_body_bytes",
    500: "an unexpected error",
}
LEASE_DATE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}$"
STAMP = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$"
RESPONSE_HEADERS = {
    "OpenStack-API-Version": {
        "description": "the microversion that answered",
        "schema": {"type": "string", "const": "reservation 1.0"},
    },
    "x-openstack-request-id": {
        "description": "an id for this request, for the logs",
        "schema": {"type": "string", "pattern": "^req-"},
    },
}


def _ref(name: str) -> JsonSchema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: JsonSchema) -> JsonSchema:
    return {"anyOf": [schema, {"type": "null"}]}


def _record(properties: Mapping[str, JsonSchema], **extra: Any) -> JsonSchema:
    """An object with exactly these keys, all present (how ``wire.py`` renders)."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


def _wrapped(key: str, schema: JsonSchema) -> JsonSchema:
    return _record({key: schema})


def _enum(values: type[Any]) -> JsonSchema:
    return {"type": "string", "enum": [v.value for v in values]}


STRING: JsonSchema = {"type": "string"}
LEASE_DATE_STRING: JsonSchema = {"type": "string", "pattern": LEASE_DATE}
STAMP_STRING: JsonSchema = {"type": "string", "pattern": STAMP}
INTEGER_STRING: JsonSchema = {"type": "string", "pattern": r"^\s*[0-9]{1,18}\s*$"}
REQUEST_DATE: JsonSchema = {
    "type": "string",
    "pattern": r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}",
    "description": "'YYYY-MM-DD HH:MM' (UTC) or ISO 8601; before year 9000",
}
DURATION: JsonSchema = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "description": "seconds, 'HH:MM' or an ISO 8601 duration such as 'PT2H' or 'P1DT12H'",
}
QUERY: JsonSchema = {
    "anyOf": [{"type": "string"}, {"type": "array"}],
    "description": 'a property query such as \'["==", "$gpu", "a100"]\'; "" matches every host',
}
COUNT: JsonSchema = {
    "anyOf": [{"type": "integer", "minimum": 1}, INTEGER_STRING],
    "description": "an integer, or an integer string as the blazar CLI sends",
}
HOST_INTEGER: JsonSchema = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_INT},
        INTEGER_STRING,
        {"type": "null"},
    ]
}
HOST_TEXT: JsonSchema = _nullable({"type": "string", "maxLength": PROPERTY_VALUE_LENGTH})
EXTRA_VALUE: JsonSchema = {
    "anyOf": [
        {"type": "string", "maxLength": PROPERTY_VALUE_LENGTH},
        {"type": "number"},
        {"type": "boolean"},
    ],
    "description": "an extra property (numbers and booleans are stored as strings)",
}


def _end_policies(resource_type: type[ResourceType]) -> JsonSchema:
    offered = [p.value for p in EndPolicy if p in resource_type.end_policies]
    return {"type": "string", "enum": offered}


def _policies(resource_type: type[ResourceType]) -> dict[str, JsonSchema]:
    """A reservation's policy fields in a request (docs/policies.md)."""
    return {
        "start_policy": {
            **_nullable(_enum(StartPolicy)),
            "description": "auto (default): the backend starts the workload; manual: it holds "
            "the resources until POST .../reservations/{id}/start",
        },
        "end_policy": {
            **_nullable(_end_policies(resource_type)),
            "description": "what the end does with the workload (release by default); the "
            "resources go back to the pool whatever it is",
        },
    }


def _policies_shown(resource_type: type[ResourceType]) -> dict[str, JsonSchema]:
    """A reservation's policies in a response, and what its project did under them."""
    return {
        "start_policy": _enum(StartPolicy),
        "end_policy": _end_policies(resource_type),
        "started_at": {
            **_nullable(LEASE_DATE_STRING),
            "description": "when its project started a manual reservation",
        },
        "acknowledged": {
            **_nullable({"type": "boolean"}),
            "description": "keep-until-ack: whether its project acknowledged the end; null for "
            "other end policies",
        },
        "acknowledged_at": _nullable(LEASE_DATE_STRING),
    }


_PHYSICAL_HOST_FIELDS: dict[str, JsonSchema] = {
    "min": COUNT,
    "max": COUNT,
    "count_range": {"type": "string", "pattern": r"^[0-9]+(-[0-9]+)?$"},
    "hypervisor_properties": QUERY,
    "resource_properties": QUERY,
    "before_end": {"type": "string", "enum": sorted(PhysicalHostType.before_end_actions)},
    **_policies(PhysicalHostType),
}
SCHEMAS: dict[str, JsonSchema] = {
    "ReservationCreate": {
        "type": "object",
        "properties": {
            "resource_type": {"type": "string", "const": PhysicalHostType.name},
            **_PHYSICAL_HOST_FIELDS,
        },
        "required": ["resource_type"],
        "additionalProperties": False,
        "description": "min and max are required, directly or through count_range",
    },
    "ReservationUpdate": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "required when the lease has several"},
            "resource_type": {"type": "string", "const": PhysicalHostType.name},
            **_PHYSICAL_HOST_FIELDS,
        },
        "additionalProperties": False,
    },
    "Reservation": _record(
        {
            "id": {"type": "string", "format": "uuid"},
            "lease_id": {"type": "string", "format": "uuid"},
            "status": _enum(ReservationStatus),
            "missing_resources": {"type": "boolean"},
            "resources_changed": {"type": "boolean"},
            "resource_id": STRING,
            "resource_type": {"type": "string", "const": PhysicalHostType.name},
            "min": {"type": "integer", "minimum": 1},
            "max": {"type": "integer", "minimum": 1},
            "hypervisor_properties": STRING,
            "resource_properties": STRING,
            "before_end": _PHYSICAL_HOST_FIELDS["before_end"],
            **_policies_shown(PhysicalHostType),
            "allocations": {"type": "array", "items": _ref("ReservationAllocation")},
            "created_at": STAMP_STRING,
            "updated_at": _nullable(STAMP_STRING),
        }
    ),
    "ReservationAllocation": _record(
        {
            "resource_id": {"type": "string", "pattern": "^[0-9]+$"},
            "start_date": LEASE_DATE_STRING,
            "end_date": LEASE_DATE_STRING,
        }
    ),
}

_RESERVATION_COMMON: dict[str, JsonSchema] = {
    "id": {"type": "string", "format": "uuid"},
    "lease_id": {"type": "string", "format": "uuid"},
    "status": _enum(ReservationStatus),
    "missing_resources": {"type": "boolean"},
    "resources_changed": {"type": "boolean"},
    "resource_id": STRING,
}
_BEFORE_END: JsonSchema = {"type": "string", "enum": ["default"]}
_TYPE_FIELDS: dict[str, dict[str, JsonSchema]] = {
    DeviceType.name: {
        "min": COUNT,
        "max": COUNT,
        "resource_properties": QUERY,
        "before_end": _BEFORE_END,
    },
    NetworkType.name: {
        "amount": COUNT,
        "network_properties": QUERY,
        "resource_properties": QUERY,
        "before_end": _BEFORE_END,
    },
    FloatingIPType.name: {
        "network_id": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "amount": COUNT,
        "required_floatingips": {
            "type": "array",
            "maxItems": MAX_REQUIRED,
            "uniqueItems": True,
            "items": STRING,
            "description": "addresses of the network that must be among those reserved",
        },
        "before_end": _BEFORE_END,
    },
    VolumeType.name: {
        "size_gb": COUNT,
        "amount": COUNT,
        "pool": _nullable({"type": "string", "maxLength": 255}),
        "resource_properties": QUERY,
        "before_end": _BEFORE_END,
    },
    InstanceType.name: {
        "amount": COUNT,
        "vcpus": COUNT,
        "memory_mb": COUNT,
        "disk_gb": {
            "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[0-9]+$"}]
        },
        "affinity": {
            "anyOf": [{"type": "boolean"}, {"type": "null"}, {"type": "string"}],
            "description": "true: all on one host; false: each on its own; null: anywhere "
            '(also "True", "False", "None")',
        },
        "resource_properties": QUERY,
        "before_end": _BEFORE_END,
    },
}
_STORED: dict[str, dict[str, JsonSchema]] = {
    DeviceType.name: {
        "min": {"type": "integer", "minimum": 1},
        "max": {"type": "integer", "minimum": 1},
        "resource_properties": STRING,
    },
    NetworkType.name: {
        "amount": {"type": "integer", "minimum": 1},
        "network_properties": STRING,
        "resource_properties": STRING,
    },
    FloatingIPType.name: {
        "network_id": STRING,
        "amount": {"type": "integer", "minimum": 1},
        "required_floatingips": {"type": "array", "items": STRING},
    },
    VolumeType.name: {
        "size_gb": {"type": "integer", "minimum": 1},
        "amount": {"type": "integer", "minimum": 1},
        "pool": _nullable(STRING),
        "resource_properties": STRING,
    },
    InstanceType.name: {
        "amount": {"type": "integer", "minimum": 1},
        "vcpus": {"type": "integer", "minimum": 1},
        "memory_mb": {"type": "integer", "minimum": 1},
        "disk_gb": {"type": "integer", "minimum": 0},
        "affinity": _nullable({"type": "boolean"}),
        "resource_properties": STRING,
        "flavor_id": {"type": "string", "description": "the reservation's private flavor"},
        "aggregate_id": {"type": "string", "description": "the aggregate of its hosts"},
        "server_group_id": _nullable({"type": "string", "format": "uuid"}),
        "hosts": {
            "type": "array",
            "items": _record(
                {
                    "host_id": {"type": "string", "pattern": "^[0-9]+$"},
                    "count": {"type": "integer", "minimum": 1},
                }
            ),
        },
    },
}
_TYPE_NAMES = {
    DeviceType.name: "Device",
    NetworkType.name: "Network",
    FloatingIPType.name: "FloatingIP",
    VolumeType.name: "Volume",
    InstanceType.name: "Instance",
}
_TYPE_CLASSES: dict[str, type[ResourceType]] = {
    t.name: t for t in (DeviceType, NetworkType, FloatingIPType, VolumeType, InstanceType)
}
_TYPE_REQUIRED = {
    DeviceType.name: ["min", "max"],
    NetworkType.name: [],
    FloatingIPType.name: ["network_id"],
    VolumeType.name: ["size_gb"],
    InstanceType.name: ["amount", "vcpus", "memory_mb", "disk_gb"],
}


def _reservation_schemas(resource_type: str) -> dict[str, JsonSchema]:
    name = _TYPE_NAMES[resource_type]
    fields = {**_TYPE_FIELDS[resource_type], **_policies(_TYPE_CLASSES[resource_type])}
    kind: JsonSchema = {"type": "string", "const": resource_type}
    return {
        f"{name}ReservationCreate": {
            "type": "object",
            "properties": {"resource_type": kind, **fields},
            "required": ["resource_type", *_TYPE_REQUIRED[resource_type]],
            "additionalProperties": False,
        },
        f"{name}ReservationUpdate": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "required when the lease has several"},
                "resource_type": kind,
                **fields,
            },
            "additionalProperties": False,
        },
        f"{name}Reservation": _record(
            {
                **_RESERVATION_COMMON,
                "resource_type": kind,
                **_STORED[resource_type],
                "before_end": _BEFORE_END,
                **_policies_shown(_TYPE_CLASSES[resource_type]),
                "allocations": {"type": "array", "items": _ref(_ALLOCATION[resource_type])},
                "created_at": STAMP_STRING,
                "updated_at": _nullable(STAMP_STRING),
            }
        ),
    }


_ALLOCATION = {
    t: "InstanceAllocation" if t == InstanceType.name else "ReservationAllocation"
    for t in _TYPE_NAMES
}


def _any(suffix: str, host: str) -> JsonSchema:
    return {
        "oneOf": [_ref(host), *(_ref(f"{name}{suffix}") for name in _TYPE_NAMES.values())],
        "description": "one reservation; its resource_type says which fields it has",
    }


ITEM_SCHEMAS: dict[str, JsonSchema] = {
    **{k: v for t in _TYPE_NAMES for k, v in _reservation_schemas(t).items()},
    "AnyReservationCreate": _any("ReservationCreate", "ReservationCreate"),
    "AnyReservationUpdate": {
        "anyOf": [
            _ref("ReservationUpdate"),
            *(_ref(f"{name}ReservationUpdate") for name in _TYPE_NAMES.values()),
        ],
        "description": "changes to one reservation, of the fields of its resource_type",
    },
    "AnyReservation": _any("Reservation", "Reservation"),
    "InstanceAllocation": _record(
        {
            "resource_id": {"type": "string", "pattern": "^[0-9]+$"},
            "count": {"type": "integer", "minimum": 1},
            "start_date": LEASE_DATE_STRING,
            "end_date": LEASE_DATE_STRING,
        }
    ),
}

SCHEMAS.update(ITEM_SCHEMAS)


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's generated document, from the routes' models and ``responses``: links from
    what a POST creates, no 422 (this app answers 400), and the hand-written components."""
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    links: list[tuple[str, str, Any, tuple[str, str]]] = []
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            # FastAPI declares a 422 for parameter errors; this app answers them with a 400.
            operation["responses"].pop("422", None)
            for status, response in operation["responses"].items():
                creates = response.pop(CREATES, None)
                if creates is not None:
                    links.append((method, path, status, (creates[0], creates[1])))
    for method, path, status, (parameter, pointer) in links:
        response = spec["paths"][path][method]["responses"][status]
        response["links"] = _links(spec["paths"], parameter, pointer)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for generated in ("HTTPValidationError", "ValidationError"):
        schemas.pop(generated, None)
    schemas.update(SCHEMAS)
    schemas.update(request_models())
    written: dict[str, Any] = json.loads(components(json.dumps(spec)))
    return written


def _links(paths: Mapping[str, Any], parameter: str, pointer: str) -> dict[str, Any]:
    """Links from a created resource to every operation that takes its id as ``parameter``."""
    return {
        operation["operationId"]: {
            "operationId": operation["operationId"],
            "parameters": {parameter: f"$response.body#{pointer}"},
        }
        for path, methods in paths.items()
        if f"{{{parameter}}}" in path
        for operation in methods.values()
    }


def install(app: FastAPI) -> None:
    """Serve ``document(app)`` at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def allowed_methods(app: FastAPI, path: str) -> str:
    """The ``Allow`` header of a 405: every method the document lists for a path matching
    ``path`` (Starlette names only those of the first route that matches it)."""
    found = {
        method.upper()
        for template, methods in app.openapi()["paths"].items()
        if compile_path(template)[0].match(path)
        for method in methods
    }
    return ", ".join(sorted(found))
