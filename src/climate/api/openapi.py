"""The OpenAPI document: every route's request body and every response it can give, in one place.

Routes read raw bodies (Blazar's loose JSON, parsed by ``parsing.py``) and answer with shapes
rendered by ``wire.py``, so FastAPI cannot infer either. ``OPERATIONS`` states them per method and
path, ``SCHEMAS`` holds the shapes, and ``install`` merges both into FastAPI's generated document
(which still contributes the path and query parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from climate.db.tables import NAME_LENGTH, PROPERTY_NAME_LENGTH, PROPERTY_VALUE_LENGTH
from climate.domain.status import EventStatus, EventType, LeaseStatus, ReservationStatus
from climate.resources.hosts import PhysicalHostType
from climate.services.availability import MAX_STEP, MAX_WINDOWS
from climate.services.hosts import INT_COLUMNS, MAX_INT, READ_ONLY, TEXT_COLUMNS

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

_PHYSICAL_HOST_FIELDS: dict[str, JsonSchema] = {
    "min": COUNT,
    "max": COUNT,
    "count_range": {"type": "string", "pattern": r"^[0-9]+(-[0-9]+)?$"},
    "hypervisor_properties": QUERY,
    "resource_properties": QUERY,
    "before_end": {"type": "string", "enum": sorted(PhysicalHostType.before_end_actions)},
}
_LEASE_FIELDS: dict[str, JsonSchema] = {
    "name": {"type": "string", "minLength": 1, "maxLength": NAME_LENGTH},
    "start_date": {"anyOf": [{"const": "now"}, REQUEST_DATE]},
    "end_date": REQUEST_DATE,
    "before_end_date": _nullable(REQUEST_DATE),
    "events": {"type": "array", "maxItems": 0, "description": "user-defined events: always []"},
}
_HOST_FIELDS: dict[str, JsonSchema] = {
    **dict.fromkeys(sorted(INT_COLUMNS), HOST_INTEGER),
    **dict.fromkeys(sorted(TEXT_COLUMNS - {"cpu_info"}), HOST_TEXT),
    "cpu_info": _nullable(STRING),
    "reservable": {"type": "boolean"},
}

SCHEMAS: dict[str, JsonSchema] = {
    "Error": _record(
        {
            "error_code": {"type": "integer", "description": "the HTTP status"},
            "error_message": {"type": "string", "description": "for 4xx, names the field"},
            "error_name": {"type": "string", "examples": ["INVALID_INPUT", "NOT_FOUND"]},
        },
        description="Blazar's error body",
    ),
    "Versions": _wrapped(
        "versions",
        {
            "type": "array",
            "items": _record(
                {
                    "id": {"type": "string", "const": "v1.0"},
                    "status": {"type": "string", "const": "CURRENT"},
                    "links": {
                        "type": "array",
                        "items": _record({"href": STRING, "rel": {"const": "self"}}),
                    },
                    "min_version": STRING,
                    "max_version": STRING,
                }
            ),
        },
    ),
    "LeaseCreate": {
        "type": "object",
        "properties": {
            **_LEASE_FIELDS,
            "reservations": {"type": "array", "minItems": 1, "items": _ref("ReservationCreate")},
        },
        "required": ["name", "end_date", "reservations"],
        "additionalProperties": False,
        "examples": [
            {
                "name": "gpu-training",
                "start_date": "2031-06-01 09:00",
                "end_date": "2031-06-01 17:00",
                "reservations": [
                    {
                        "resource_type": "physical:host",
                        "min": 1,
                        "max": 1,
                        "hypervisor_properties": "",
                        "resource_properties": "",
                        "before_end": "default",
                    }
                ],
                "events": [],
            }
        ],
    },
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
    "LeaseUpdate": {
        "type": "object",
        "properties": {
            **_LEASE_FIELDS,
            "reservations": {"type": "array", "items": _ref("ReservationUpdate")},
        },
        "minProperties": 1,
        "additionalProperties": False,
        "examples": [{"end_date": "2031-06-01 18:00", "events": []}],
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
    "Lease": _record(
        {
            "id": {"type": "string", "format": "uuid"},
            "name": STRING,
            "start_date": LEASE_DATE_STRING,
            "end_date": LEASE_DATE_STRING,
            "status": _enum(LeaseStatus),
            "status_reason": _nullable(STRING),
            "degraded": {"type": "boolean"},
            "user_id": STRING,
            "project_id": STRING,
            "trust_id": _nullable(STRING),
            "created_at": STAMP_STRING,
            "updated_at": _nullable(STAMP_STRING),
            "reservations": {"type": "array", "items": _ref("Reservation")},
            "events": {"type": "array", "items": _ref("Event")},
        }
    ),
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
    "Event": _record(
        {
            "id": {"type": "string", "format": "uuid"},
            "lease_id": {"type": "string", "format": "uuid"},
            "status": _enum(EventStatus),
            "event_type": _enum(EventType),
            "time": LEASE_DATE_STRING,
            "attempts": {"type": "integer", "minimum": 0},
            "last_error": _nullable(STRING),
            "created_at": STAMP_STRING,
            "updated_at": _nullable(STAMP_STRING),
        }
    ),
    "HostCreate": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S"},
            **_HOST_FIELDS,
        },
        "required": ["name"],
        "additionalProperties": EXTRA_VALUE,
        "propertyNames": {
            "minLength": 1,
            "maxLength": PROPERTY_NAME_LENGTH,
            "not": {"enum": sorted(READ_ONLY - {"name"})},
        },
        "examples": [{"name": "compute-1", "gpu": "a100", "rack": "r1"}],
    },
    "HostUpdate": {
        "type": "object",
        "properties": _HOST_FIELDS,
        "additionalProperties": _nullable(EXTRA_VALUE),
        "propertyNames": {
            "minLength": 1,
            "maxLength": PROPERTY_NAME_LENGTH,
            "not": {"enum": sorted(READ_ONLY)},
        },
        "minProperties": 1,
        "description": "an extra property set to null is removed",
        "examples": [{"rack": "r2"}],
    },
    "Host": _record(
        {
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "hypervisor_hostname": STRING,
            "service_name": _nullable(STRING),
            "hypervisor_type": _nullable(STRING),
            "hypervisor_version": _nullable({"type": "integer"}),
            "vcpus": _nullable({"type": "integer"}),
            "memory_mb": _nullable({"type": "integer"}),
            "local_gb": _nullable({"type": "integer"}),
            "cpu_info": _nullable(STRING),
            "reservable": {"type": "boolean"},
            "status": _nullable(STRING),
            "trust_id": _nullable(STRING),
            "created_at": STAMP_STRING,
            "updated_at": _nullable(STAMP_STRING),
        },
        additionalProperties={"type": "string", "description": "the host's extra properties"},
    ),
    "HostAllocation": _record(
        {
            "resource_id": {"type": "string", "pattern": "^[0-9]+$"},
            "reservations": {
                "type": "array",
                "items": _record(
                    {
                        "id": {"type": "string", "format": "uuid"},
                        "lease_id": {"type": "string", "format": "uuid"},
                        "start_date": LEASE_DATE_STRING,
                        "end_date": LEASE_DATE_STRING,
                    }
                ),
            },
        }
    ),
    "PropertyList": _wrapped(
        "resource_properties",
        {
            "type": "array",
            "items": {
                "anyOf": [
                    _record({"property": STRING}),
                    _record(
                        {
                            "property": STRING,
                            "private": {"type": "boolean"},
                            "values": {"type": "array", "items": STRING},
                        }
                    ),
                ]
            },
            "description": "names only, or with privacy and values when detail=True",
        },
    ),
    "PropertyUpdate": {
        "type": "object",
        "properties": {"private": {"type": "boolean"}},
        "required": ["private"],
        "examples": [{"private": True}],
    },
    "ForceEnd": {
        "type": "object",
        "properties": {
            "skip_backend": {
                "type": "boolean",
                "default": False,
                "description": "end the lease without asking the backend to release anything",
            }
        },
        "additionalProperties": False,
    },
    "AuditRecord": _record(
        {
            "id": {"type": "integer"},
            "at": LEASE_DATE_STRING,
            "actor_user": _nullable(STRING),
            "actor_project": _nullable(STRING),
            "action": STRING,
            "target_type": STRING,
            "target_id": STRING,
            "detail": {"description": "what changed, as JSON (null when nothing more to say)"},
        }
    ),
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
    "AvailabilityWindow": _record(
        {
            "start_date": LEASE_DATE_STRING,
            "end_date": LEASE_DATE_STRING,
            "reservations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "resource_type": {"type": "string", "const": PhysicalHostType.name},
                        "min": {"type": "integer", "minimum": 1},
                        "max": {"type": "integer", "minimum": 1},
                        "available": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "matching hosts free for the whole window",
                        },
                        "hosts": {
                            "type": "array",
                            "items": {"type": "string", "pattern": "^[0-9]+$"},
                            "description": "the host ids admission would grant now",
                        },
                        "host_names": {
                            "type": "array",
                            "items": STRING,
                            "description": "only to callers that may list hosts",
                        },
                    },
                    "required": ["resource_type", "min", "max", "available", "hosts"],
                    "additionalProperties": False,
                },
            },
        }
    ),
    "CapacityTimeline": _record(
        {
            "start_date": LEASE_DATE_STRING,
            "end_date": LEASE_DATE_STRING,
            "bucket": {"type": "integer", "minimum": 1, "description": "seconds"},
            "hosts": {"type": "integer", "minimum": 0, "description": "hosts matching"},
            "buckets": {
                "type": "array",
                "items": _record(
                    {
                        "start_date": LEASE_DATE_STRING,
                        "free": {"type": "integer", "minimum": 0},
                        "busy": {"type": "integer", "minimum": 0},
                        "partly_busy": {"type": "integer", "minimum": 0},
                    }
                ),
            },
        }
    ),
    "ResourceProperty": _record(
        {
            "id": {"type": "string", "format": "uuid"},
            "resource_type": {"type": "string", "const": PhysicalHostType.name},
            "property_name": STRING,
            "private": {"type": "boolean"},
            "created_at": STAMP_STRING,
            "updated_at": _nullable(STAMP_STRING),
        }
    ),
}

_ANSWERS: dict[str, JsonSchema] = {
    "lease": _wrapped("lease", _ref("Lease")),
    "leases": _wrapped("leases", {"type": "array", "items": _ref("Lease")}),
    "host": _wrapped("host", _ref("Host")),
    "hosts": _wrapped("hosts", {"type": "array", "items": _ref("Host")}),
    "allocation": _wrapped("allocation", _ref("HostAllocation")),
    "allocations": _wrapped("allocations", {"type": "array", "items": _ref("HostAllocation")}),
    "properties": _ref("PropertyList"),
    "property": _wrapped("resource_property", _ref("ResourceProperty")),
    "versions": _ref("Versions"),
    "audit": _wrapped("audit_log", {"type": "array", "items": _ref("AuditRecord")}),
    "windows": _wrapped("windows", {"type": "array", "items": _ref("AvailabilityWindow")}),
    "timeline": _wrapped("timeline", _ref("CapacityTimeline")),
}


@dataclass(frozen=True)
class Operation:
    """What one method on one path takes and answers.

    :param ok: the success status and the key of its body in ``_ANSWERS`` (None: no body).
    :param errors: the error statuses it can answer with, besides 500.
    :param body: the component of its JSON request body, if it reads one.
    :param body_required: False when an empty body means "all defaults".
    :param creates: the path parameter that names what it created and where the success body
        holds its value (a JSON pointer): every operation taking that parameter gets a link.
    """

    ok: tuple[int, str | None]
    errors: frozenset[int] = field(default_factory=frozenset)
    body: str | None = None
    body_required: bool = True
    creates: tuple[str, str] | None = None

    def responses(self) -> dict[str, Any]:
        status, answer = self.ok
        found: dict[str, Any] = {
            str(status): _response("no content" if answer is None else answer, answer)
        }
        for code in sorted(self.errors | {500}):
            found[str(code)] = _error_response(code)
        return found

    def request_body(self) -> dict[str, Any] | None:
        if self.body is None:
            return None
        return {
            "required": self.body_required,
            "content": {"application/json": {"schema": _ref(self.body)}},
        }


def _response(description: str, answer: str | None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "headers": RESPONSE_HEADERS}
    if answer is not None:
        response["content"] = {"application/json": {"schema": _ANSWERS[answer]}}
    return response


def _error_response(status: int) -> dict[str, Any]:
    schema = {"allOf": [_ref("Error"), {"properties": {"error_code": {"const": status}}}]}
    return {
        "description": ERROR_MEANINGS[status],
        "headers": RESPONSE_HEADERS,
        "content": {"application/json": {"schema": schema}},
    }


# 400 everywhere: a NUL byte in the path or query is refused before routing. Under /v1 every
# call needs an identity (401) and passes a policy rule the operator may tighten (403).
_ANYONE = frozenset({400})
_V1 = frozenset({400, 401, 403})
_ONE = _V1 | {404}
_WRITE = frozenset({409, 413})

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/"): Operation((300, "versions"), _ANYONE),
    ("GET", "/versions"): Operation((300, "versions"), _ANYONE),
    ("GET", "/v1/leases"): Operation((200, "leases"), _V1),
    ("POST", "/v1/leases"): Operation(
        (201, "lease"), _V1 | _WRITE, "LeaseCreate", creates=("lease_id", "/lease/id")
    ),
    ("GET", "/v1/leases/{lease_id}"): Operation((200, "lease"), _ONE),
    ("PUT", "/v1/leases/{lease_id}"): Operation((200, "lease"), _ONE | _WRITE, "LeaseUpdate"),
    ("DELETE", "/v1/leases/{lease_id}"): Operation((204, None), _ONE),
    ("POST", "/v1/leases/{lease_id}/retry"): Operation((200, "lease"), _ONE | {409}),
    ("POST", "/v1/leases/{lease_id}/force-end"): Operation(
        (200, "lease"), _ONE | _WRITE, "ForceEnd", body_required=False
    ),
    ("GET", "/v1/os-hosts"): Operation((200, "hosts"), _V1),
    ("POST", "/v1/os-hosts"): Operation(
        (201, "host"), _V1 | _WRITE, "HostCreate", creates=("host_id", "/host/id")
    ),
    ("GET", "/v1/os-hosts/allocations"): Operation((200, "allocations"), _V1),
    ("GET", "/v1/os-hosts/properties"): Operation((200, "properties"), _V1),
    ("PATCH", "/v1/os-hosts/properties/{name}"): Operation(
        (200, "property"), _ONE | {413}, "PropertyUpdate"
    ),
    ("GET", "/v1/os-hosts/{host_id}"): Operation((200, "host"), _ONE),
    ("PUT", "/v1/os-hosts/{host_id}"): Operation((200, "host"), _ONE | {413}, "HostUpdate"),
    ("DELETE", "/v1/os-hosts/{host_id}"): Operation((204, None), _ONE | {409}),
    ("GET", "/v1/os-hosts/{host_id}/allocation"): Operation((200, "allocation"), _ONE),
    ("GET", "/v1/audit"): Operation((200, "audit"), _V1),
    ("POST", "/v1/availability"): Operation((200, "windows"), _V1 | {413}, "AvailabilitySearch"),
    ("GET", "/v1/availability/timeline"): Operation((200, "timeline"), _V1),
}


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's generated document with the bodies and responses of ``OPERATIONS``."""
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            # FastAPI declares a 422 for parameter errors; this app answers them with a 400.
            operation["responses"].pop("422", None)
            described = OPERATIONS.get((method.upper(), path))
            if described is None:
                # Left as FastAPI made it; tests/test_openapi.py fails on such a route.
                continue
            operation["responses"] = described.responses()
            body = described.request_body()
            if body is not None:
                operation["requestBody"] = body
    for (method, path), described in OPERATIONS.items():
        if described.creates is not None and path in spec["paths"]:
            response = spec["paths"][path][method.lower()]["responses"][str(described.ok[0])]
            response["links"] = _links(spec["paths"], *described.creates)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for generated in ("HTTPValidationError", "ValidationError"):
        schemas.pop(generated, None)
    schemas.update(SCHEMAS)
    return spec


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
