"""Host requests: register a host, change one, make a property private.

A host's columns and extra capabilities are checked by ``services/hosts.py`` with its own
messages, so these fields take any JSON value and state the accepted ones for the document;
the edge checks what Blazar checks there (the length of a new host's extra capability names).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, JsonValue, WithJsonSchema, model_validator

from climate import inputs
from climate.api.schemas import nullable
from climate.db.tables import PROPERTY_NAME_LENGTH, PROPERTY_VALUE_LENGTH
from climate.errors import InvalidInput
from climate.services.hosts import MAX_INT, READ_ONLY

EXTRA_KEY_LENGTH = 64
"""Blazar's limit on a new host's extra capability names (its host columns are all shorter;
Blazar does not check an update's)."""
Integer = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_INT},
                {"type": "string", "pattern": r"^\s*[0-9]{1,18}\s*$"},
                {"type": "null"},
            ]
        }
    ),
]
Text = Annotated[
    Any, WithJsonSchema(nullable({"type": "string", "maxLength": PROPERTY_VALUE_LENGTH}))
]
_FIXED: list[JsonValue] = [*sorted(READ_ONLY)]
_FIXED_NEW: list[JsonValue] = [*sorted(READ_ONLY - {"name"})]
Boolean = Annotated[Any, WithJsonSchema({"type": "boolean"})]
EXTRA_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": PROPERTY_VALUE_LENGTH},
        {"type": "number"},
        {"type": "boolean"},
    ],
    "description": "an extra property (numbers and booleans are stored as strings)",
}


class HostColumns(BaseModel):
    """What Nova would say of a host (``enrol`` fills them from the cloud where it can)."""

    cpu_info: Annotated[Any, WithJsonSchema(nullable({"type": "string"}))] = None
    hypervisor_type: Text = None
    hypervisor_version: Integer = None
    local_gb: Integer = None
    memory_mb: Integer = None
    service_name: Text = None
    vcpus: Integer = None
    reservable: Boolean = None


class HostCreate(HostColumns):
    """A host: its name, its columns, and any other field as an extra capability."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "additionalProperties": EXTRA_VALUE,
            "propertyNames": {
                "minLength": 1,
                "maxLength": EXTRA_KEY_LENGTH,
                "not": {"enum": _FIXED_NEW},
            },
            "examples": [{"name": "compute-1", "gpu": "a100", "rack": "r1"}],
        },
    )

    name: Annotated[
        Any, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S"})
    ]

    @model_validator(mode="before")
    @classmethod
    def _short_keys(cls, data: Any) -> Any:
        """Blazar's ``Extra capability key too long``."""
        for key in data if isinstance(data, dict) else ():
            if len(key) > EXTRA_KEY_LENGTH:
                raise InvalidInput(
                    inputs.shown(key),
                    f"Extra capability key too long (at most {EXTRA_KEY_LENGTH} characters, "
                    f"not {len(key)})",
                )
        return data


class HostUpdate(HostColumns):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "additionalProperties": nullable(EXTRA_VALUE),
            "propertyNames": {
                "minLength": 1,
                "maxLength": PROPERTY_NAME_LENGTH,
                "not": {"enum": _FIXED},
            },
            "minProperties": 1,
            "description": "an extra property set to null is removed",
            "examples": [{"rack": "r2"}],
        },
    )


class PropertyUpdate(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"private": True}]})

    private: Annotated[Any, WithJsonSchema({"type": "boolean"})] = None
    """Left out: the property as it is (Blazar answers an empty update so)."""


def given(model: BaseModel) -> dict[str, Any]:
    """The fields a request gave, extra ones included, as it gave them."""
    return model.model_dump(exclude_unset=True)
