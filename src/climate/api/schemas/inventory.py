"""What the inventory routes answer, as ``wire.py`` and ``api/hosts.allocation`` render it:
hosts, devices, network segments, floating IPs and volume pools, and their allocations."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from climate.api.schemas.shapes import (
    Extensible,
    LeaseDate,
    NumericId,
    Positive,
    Record,
    Stamp,
    Uuid,
)
from climate.resources.kinds import Kind


class Host(Extensible):
    """A host as Blazar shows it, then its health, then its extra properties."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "additionalProperties": {
                "type": "string",
                "description": "the host's extra properties",
            }
        },
    )

    id: NumericId
    hypervisor_hostname: str
    service_name: str | None
    hypervisor_type: str | None
    hypervisor_version: int | None
    vcpus: int | None
    memory_mb: int | None
    local_gb: int | None
    cpu_info: str | None
    availability_zone: str = Field(
        description="as Blazar shows it: empty, unless the host has the extra property"
    )
    reservable: bool = Field(description="false while the host is down")
    status: str | None
    trust_id: str | None
    health: Literal["up", "down"]
    health_reason: str | None
    health_since: Stamp | None
    created_at: Stamp
    updated_at: Stamp | None


class HostAnswer(Record):
    host: Host


class Hosts(Record):
    hosts: list[Host]


class Allocated(Record):
    """One reservation's use of a resource."""

    id: Uuid
    lease_id: Uuid
    start_date: LeaseDate
    end_date: LeaseDate


class HostAllocation(Record):
    resource_id: NumericId
    reservations: list[Allocated]


class PoolAllocated(Allocated):
    size_gb: Positive


class VolumePoolAllocation(Record):
    resource_id: NumericId
    reservations: list[PoolAllocated]


class InstancesAllocated(Allocated):
    count: Positive


class HostInstances(Record):
    resource_id: NumericId
    reservations: list[InstancesAllocated]


@cache
def allocations(model: type[BaseModel]) -> tuple[type[BaseModel], type[BaseModel]]:
    """``{"allocation": model}`` and ``{"allocations": [model]}``."""
    one = create_model(f"{model.__name__}Answer", __base__=Record, allocation=(model, ...))
    many = create_model(f"{model.__name__}s", __base__=Record, allocations=(list[model], ...))  # type: ignore[valid-type]
    return one, many


class PropertyName(Record):
    property: str


class PropertyDetail(Record):
    property: str
    private: bool
    values: list[str]


class PropertyList(Record):
    resource_properties: list[PropertyName | PropertyDetail] = Field(
        description="names only, or with privacy and values when detail=True"
    )


class ResourceProperty(Record):
    id: Uuid
    resource_type: Literal["physical:host"]
    property_name: str
    private: bool
    created_at: Stamp
    updated_at: Stamp | None


class ResourcePropertyAnswer(Record):
    resource_property: ResourceProperty


class VolumePool(Extensible):
    id: NumericId
    name: str
    capacity_gb: Positive
    reservable: bool
    created_at: Stamp
    updated_at: Stamp | None


class VolumePoolAnswer(Record):
    volume_pool: VolumePool


class VolumePools(Record):
    volume_pools: list[VolumePool]


def item_models(kind: Kind) -> tuple[type[BaseModel], type[BaseModel]]:
    """A kind's ``{key: item}`` and ``{path: [item]}``: its pool and name fields, then the
    fields every item has, then its extra properties."""
    columns: dict[str, Any] = dict.fromkeys(kind.columns, (str, ...))
    shown: dict[str, Any] = dict.fromkeys(kind.shown, (str | None, ...))
    item = create_model(
        kind.model,
        __base__=Extensible,
        id=(NumericId, ...),
        **columns,
        reservable=(bool, ...),
        created_at=(Stamp, ...),
        updated_at=(Stamp | None, ...),
        **shown,
    )
    one_field: dict[str, Any] = {kind.key: (item, ...)}
    many_field: dict[str, Any] = {kind.path: (list[item], ...)}  # type: ignore[valid-type]
    one = create_model(f"{kind.model}Answer", __base__=Record, **one_field)
    many = create_model(f"{kind.model}s", __base__=Record, **many_field)
    return one, many
