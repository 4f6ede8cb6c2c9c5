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
from climate.db.tables import NAME_LENGTH, PROPERTY_NAME_LENGTH, PROPERTY_VALUE_LENGTH
from climate.domain.lease_rules import MAX_REMINDERS
from climate.domain.requests import Conflicts
from climate.domain.status import (
    EndPolicy,
    LeaseType,
    ReservationStatus,
    StartPolicy,
)
from climate.resources.base import ResourceType
from climate.resources.hosts import PhysicalHostType
from climate.resources.instances import InstanceType
from climate.resources.items import (
    DEVICES,
    FLOATING_IPS,
    MAX_REQUIRED,
    MAX_SEGMENT_ID,
    NETWORKS,
    DeviceType,
    FloatingIPType,
    Kind,
    NetworkType,
)
from climate.resources.volumes import VolumeType
from climate.services.availability import MAX_STEP, MAX_WINDOWS
from climate.services.hosts import INT_COLUMNS, MAX_INT, TEXT_COLUMNS
from climate.services.series import MAX_OCCURRENCES, NAME_ROOM

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
_LEASE_FIELDS: dict[str, JsonSchema] = {
    "name": {"type": "string", "minLength": 1, "maxLength": NAME_LENGTH},
    "start_date": {"anyOf": [{"const": "now"}, REQUEST_DATE]},
    "end_date": REQUEST_DATE,
    "before_end_date": _nullable(REQUEST_DATE),
    "events": {"type": "array", "maxItems": 0, "description": "user-defined events: always []"},
    "before_end_offset": {
        **_nullable(DURATION),
        "description": "the before-end event this long before the end (not with before_end_date)",
    },
    "reminders": {
        **_nullable({"type": "array", "maxItems": MAX_REMINDERS, "items": DURATION}),
        "description": "extra notifications (lease.before_end), each this long before the end; "
        "they move with it (docs/lease-types.md)",
    },
}
_SERIES_SCHEMAS: dict[str, JsonSchema] = {
    "SeriesCreate": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": NAME_ROOM},
            "start_date": REQUEST_DATE,
            "end_date": REQUEST_DATE,
            "duration": DURATION,
            "rrule": {
                "type": "string",
                "description": "an iCalendar RRULE value with COUNT or UNTIL, e.g. "
                "'FREQ=WEEKLY;BYDAY=TU;COUNT=8' (docs/series.md)",
            },
            "exdates": {"type": "array", "maxItems": MAX_OCCURRENCES, "items": REQUEST_DATE},
            "conflicts": {"type": "string", "enum": [c.value for c in Conflicts]},
            "reservations": {
                "type": "array",
                "minItems": 1,
                "items": _ref("AnyReservationCreate"),
            },
            "events": {"type": "array", "maxItems": 0},
            "before_end_offset": DURATION,
            "reminders": {"type": "array", "maxItems": MAX_REMINDERS, "items": DURATION},
        },
        "required": ["name", "start_date", "rrule", "reservations"],
        "additionalProperties": False,
        "description": f"a lease per occurrence, at most {MAX_OCCURRENCES}; end_date (of the "
        "first occurrence) or duration",
    },
}
_FLEXIBLE_FIELDS: dict[str, JsonSchema] = {
    "earliest_start": {"anyOf": [{"const": "now"}, REQUEST_DATE]},
    "latest_end": REQUEST_DATE,
    "duration": {
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
        "description": "seconds, 'HH:MM' or an ISO 8601 duration such as 'PT2H' or 'P1DT12H'",
    },
    "dry_run": {"type": "boolean", "description": "as the query's dry_run"},
}
_LEASE_TYPE_FIELDS: dict[str, JsonSchema] = {
    "lease_type": {
        **_enum(LeaseType),
        "description": "scheduled (default), immediate, retry or best_effort (docs/lease-types.md)",
    },
    "priority": {
        "type": "integer",
        "description": "place in the waiting queue, higher first; default 0, above 0 for "
        "admins only",
    },
    "retries": {
        "type": "integer",
        "minimum": 1,
        "description": "retry leases: at most this many attempts (not above retry_max_attempts)",
    },
    "deadline": {**REQUEST_DATE, "description": "best_effort leases: stop hunting then"},
    "hold": {
        "type": "object",
        "properties": {"expires_in": {"type": "integer", "minimum": 1}},
        "required": ["expires_in"],
        "additionalProperties": False,
        "description": "create the lease HELD, its resources allocated, until confirmed "
        "(POST /v1/leases/{id}/confirm) or lapsed after expires_in seconds",
    },
    "hold_minutes": {"type": "integer", "minimum": 1, "description": "as hold, in minutes"},
}
_HOST_FIELDS: dict[str, JsonSchema] = {
    **dict.fromkeys(sorted(INT_COLUMNS), HOST_INTEGER),
    **dict.fromkeys(sorted(TEXT_COLUMNS - {"cpu_info"}), HOST_TEXT),
    "cpu_info": _nullable(STRING),
    "reservable": {"type": "boolean"},
}

SCHEMAS: dict[str, JsonSchema] = {
    **_SERIES_SCHEMAS,
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
    "LeaseFromTemplate": {
        "type": "object",
        "properties": {
            **_LEASE_FIELDS,
            **_LEASE_TYPE_FIELDS,
            "template": {"type": "string", "description": "a Heat (HOT) template's YAML text"},
            "parameters": {
                "type": "object",
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                "description": "values of the template's parameters (else their defaults)",
            },
            "files": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "nested templates by the name the template uses (a resource type "
                "such as server.yaml, or OS::Heat::Stack's get_file), as in Heat's API",
            },
        },
        "required": ["name", "end_date", "template"],
        "additionalProperties": False,
        "description": "one lease for a Heat stack: servers by flavor, volumes (and servers' "
        "block device mapping volumes) by size, floating IPs by network, resource groups times "
        "their count, nested stacks from files (docs/resources.md, Stacks)",
    },
    "AvailabilitySearch": {
        "type": "object",
        "properties": {
            "reservations": {"type": "array", "minItems": 1, "items": _ref("ReservationCreate")},
            "duration": {
                "anyOf": [
                    {"type": "integer", "minimum": 1},
                    {"type": "string", "pattern": r"^\s*([0-9]{1,18}|[0-9]{1,6}:[0-5][0-9])\s*$"},
                ],
                "description": "seconds, or 'HH:MM'",
            },
            "search_start": {"anyOf": [{"const": "now"}, REQUEST_DATE]},
            "search_end": REQUEST_DATE,
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_WINDOWS, "default": 3},
            "step": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_STEP,
                "default": 60,
                "description": "window starts are multiples of this many seconds",
            },
        },
        "required": ["reservations", "duration", "search_end"],
        "additionalProperties": False,
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
        ],
    },
}

_NAMES = {DEVICES.kind: "Device", NETWORKS.kind: "Network", FLOATING_IPS.kind: "FloatingIP"}
_PROPERTY_NAMES: JsonSchema = {
    "minLength": 1,
    "maxLength": PROPERTY_NAME_LENGTH,
    "not": {"enum": ["id", "created_at", "updated_at"]},
}
_ITEM_NAME_FIELDS: dict[str, dict[str, JsonSchema]] = {
    DEVICES.kind: {"name": {"type": "string", "minLength": 1, "maxLength": 255}},
    NETWORKS.kind: {
        "segment_id": {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_SEGMENT_ID},
                INTEGER_STRING,
            ]
        },
        "physical_network": {"type": "string", "maxLength": 255},
        "network_type": {"type": "string", "maxLength": PROPERTY_VALUE_LENGTH},
    },
    FLOATING_IPS.kind: {
        "floating_network_id": {"type": "string", "minLength": 1, "maxLength": 255},
        "floating_ip_address": {"type": "string", "description": "an IPv4 or IPv6 address"},
        "subnet_id": {"type": "string", "maxLength": PROPERTY_VALUE_LENGTH},
    },
}
_ITEM_EXAMPLES: dict[str, JsonSchema] = {
    DEVICES.kind: {"name": "gpu-0", "model": "a100"},
    NETWORKS.kind: {"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100},
    FLOATING_IPS.kind: {
        "floating_network_id": "1e17587e-a7ed-4b82-a17b-4beb32523e28",
        "floating_ip_address": "172.24.4.101",
    },
}


def _item_schemas(kind: Kind) -> dict[str, JsonSchema]:
    name = _NAMES[kind.kind]
    fields = _ITEM_NAME_FIELDS[kind.kind]
    return {
        f"{name}Create": {
            "type": "object",
            "properties": {**fields, "reservable": {"type": "boolean"}},
            # A segment's physical network is optional; a floating IP's network is not.
            "required": [*kind.columns, *kind.required]
            if kind is FLOATING_IPS
            else [kind.name_field, *kind.required],
            "additionalProperties": EXTRA_VALUE,
            "propertyNames": _PROPERTY_NAMES,
            "examples": [_ITEM_EXAMPLES[kind.kind]],
        },
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
    **{k: v for kind in (DEVICES, NETWORKS, FLOATING_IPS) for k, v in _item_schemas(kind).items()},
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
    "ItemUpdate": {
        "type": "object",
        "properties": {"reservable": {"type": "boolean"}},
        "additionalProperties": _nullable(EXTRA_VALUE),
        "propertyNames": _PROPERTY_NAMES,
        "minProperties": 1,
        "description": "extra properties (null removes one) and reservable; the fields that "
        "identify the item cannot change",
        "examples": [{"model": "h100"}],
    },
    "VolumePoolCreate": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S"},
            "capacity_gb": {
                "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_INT}, INTEGER_STRING]
            },
            "reservable": {"type": "boolean"},
        },
        "required": ["name", "capacity_gb"],
        "additionalProperties": EXTRA_VALUE,
        "propertyNames": _PROPERTY_NAMES,
        "examples": [{"name": "ssd-1", "capacity_gb": 10000, "tier": "ssd"}],
    },
    "VolumePoolUpdate": {
        "type": "object",
        "properties": {
            "capacity_gb": {
                "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_INT}, INTEGER_STRING]
            },
            "reservable": {"type": "boolean"},
        },
        "additionalProperties": _nullable(EXTRA_VALUE),
        "propertyNames": {**_PROPERTY_NAMES, "not": {"enum": ["id", "name", "created_at"]}},
        "minProperties": 1,
        "description": "a smaller capacity is refused (409) while reservations need more",
        "examples": [{"capacity_gb": 20000}],
    },
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
