"""/v1/os-hosts: inventory, allocations and properties of physical hosts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from climate import wire
from climate.api.allocation_renders import allocation
from climate.api.deps import ActorDep, BodyDep, PageDep, ServicesDep, SortedPageDep
from climate.api.parsing import json_object, optional_date
from climate.api.rendering import JSONResponse
from climate.api.schemas import body, validated
from climate.api.schemas.answers import ONE, V1, WRITE, answers
from climate.api.schemas.hosts import HostCreate, HostUpdate, PropertyUpdate, given
from climate.api.schemas.inventory import (
    HostAllocation,
    HostAnswer,
    Hosts,
    PropertyList,
    ResourcePropertyAnswer,
    allocations,
)
from climate.errors import InvalidInput
from climate.services.healing import MAX_REASON, HealReport
from climate.services.hosts import HostAllocations

router = APIRouter(prefix="/v1/os-hosts", tags=["hosts"])
HOST_ALLOCATION, HOST_ALLOCATIONS = allocations(HostAllocation)


def _allocation(found: HostAllocations) -> dict[str, object]:
    return allocation(found.host_id, found.reservations)


@router.get("", responses=answers(200, Hosts, V1))
def list_hosts(services: ServicesDep, actor: ActorDep, page: SortedPageDep) -> JSONResponse:
    return JSONResponse({"hosts": [wire.host(h) for h in services.hosts.list_all(actor, page)]})


@router.post(
    "",
    status_code=201,
    openapi_extra=body(HostCreate),
    responses=answers(201, HostAnswer, V1 | WRITE, creates=("host_id", "/host/id")),
)
def create_host(services: ServicesDep, actor: ActorDep, raw: BodyDep) -> JSONResponse:
    fields = given(validated(HostCreate, raw))
    name = fields.pop("name")
    host = services.hosts.create(actor, name, fields)
    return JSONResponse({"host": wire.host(host)}, status_code=201)


@dataclass
class AllocationFilters:
    """Query parameters of both allocation endpoints."""

    lease_id: str | None = None
    reservation_id: str | None = None
    start_date: str | None = None
    end_date: str | None = None

    def as_arguments(self) -> dict[str, Any]:
        """An empty filter is no filter, as Blazar reads one (``?lease_id=``)."""
        return {
            "lease_id": self.lease_id or None,
            "reservation_id": self.reservation_id or None,
            "start": optional_date("start_date", self.start_date),
            "end": optional_date("end_date", self.end_date),
        }


FiltersDep = Annotated[AllocationFilters, Depends()]


@router.get("/allocations", responses=answers(200, HOST_ALLOCATIONS, V1))
def list_allocations(
    services: ServicesDep, actor: ActorDep, filters: FiltersDep, page: PageDep
) -> Response:
    """A page of hosts (by id; ``marker`` is a ``resource_id``) with their allocations."""
    found = services.hosts.allocations(actor, page=page, **filters.as_arguments())
    return Response(services.allocation_renders.body(found), media_type="application/json")


def _asked(value: str) -> bool:
    """Blazar takes any value of ``detail`` and ``all`` for yes (the CLI sends ``True``); a
    plain no is taken for no here."""
    return value.strip().lower() not in ("", "false", "0", "no", "off")


@router.get("/properties", responses=answers(200, PropertyList, V1))
def list_properties(
    services: ServicesDep, actor: ActorDep, detail: str = "False", all: str = "False"
) -> JSONResponse:
    found = services.hosts.properties(actor, include_private=_asked(all))
    if _asked(detail):
        body = [{"property": p.name, "private": p.private, "values": p.values} for p in found]
    else:
        body = [{"property": p.name} for p in found]
    return JSONResponse({"resource_properties": body})


@router.patch(
    "/properties/{name}",
    openapi_extra=body(PropertyUpdate),
    responses=answers(200, ResourcePropertyAnswer, ONE | {413}),
)
def update_property(
    services: ServicesDep, actor: ActorDep, name: str, raw: BodyDep
) -> JSONResponse:
    wanted = validated(PropertyUpdate, raw)
    if "private" in wanted.model_fields_set:
        setting = services.hosts.set_property_private(actor, name, wanted.private)
    else:
        setting = services.hosts.property_setting(actor, name)
    return JSONResponse(
        {
            "resource_property": {
                "id": setting.id,
                "resource_type": setting.resource_type,
                "property_name": setting.property_name,
                "private": setting.private,
                "created_at": wire.stamp(setting.created_at),
                "updated_at": wire.stamp(setting.updated_at),
            }
        }
    )


@router.get("/{host_id}", responses=answers(200, HostAnswer, ONE))
def show_host(services: ServicesDep, actor: ActorDep, host_id: str) -> JSONResponse:
    return JSONResponse({"host": wire.host(services.hosts.get(actor, host_id))})


@router.put(
    "/{host_id}", openapi_extra=body(HostUpdate), responses=answers(200, HostAnswer, ONE | {413})
)
def update_host(services: ServicesDep, actor: ActorDep, host_id: str, raw: BodyDep) -> JSONResponse:
    host = services.hosts.update(actor, host_id, given(validated(HostUpdate, raw)))
    return JSONResponse({"host": wire.host(host)})


@router.delete("/{host_id}", status_code=204, responses=answers(204, None, ONE | {409}))
def delete_host(services: ServicesDep, actor: ActorDep, host_id: str) -> Response:
    services.hosts.delete(actor, host_id)
    return Response(status_code=204)


@router.get("/{host_id}/allocation", responses=answers(200, HOST_ALLOCATION, ONE))
def show_allocation(
    services: ServicesDep, actor: ActorDep, host_id: str, filters: FiltersDep
) -> JSONResponse:
    found = services.hosts.allocations(actor, host_id=host_id, **filters.as_arguments())
    return JSONResponse({"allocation": _allocation(found[0])})


# -- health (docs/healing.md) ------------------------------------------------------------------


class HostHealthBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    health: Literal["up", "down"] = Field(
        description="down: the host is down, forced down or disabled; up: it is back"
    )


class HostHealthUpdate(HostHealthBase):
    """Mark a host down or up (``climate host down|up NAME``)."""

    reason: str | None = Field(
        None, max_length=MAX_REASON, description="why it is down (kept while it stays down)"
    )


class HealStep(BaseModel):
    """One reservation healed: ``from_host`` (null: a host it lacked) replaced by ``to_host``
    (null: no free matching host, the lease is degraded)."""

    lease_id: str
    reservation_id: str
    from_host: str | None
    to_host: str | None
    handed_over: bool = Field(description="the reservation was running: the backend was told")
    error: str | None = Field(None, description="why the backend could not hand to_host over")


class HostHealthPublic(HostHealthBase):
    id: str
    hypervisor_hostname: str
    reservable: bool
    health_reason: str | None
    health_since: str | None
    healed: list[HealStep]


def _health(report: HealReport) -> HostHealthPublic:
    host = report.host
    shown = wire.host(host)
    return HostHealthPublic(
        id=shown["id"],
        hypervisor_hostname=host.hypervisor_hostname,
        reservable=shown["reservable"],
        health="down" if host.health == "down" else "up",
        health_reason=host.health_reason,
        health_since=shown["health_since"],
        healed=[
            HealStep(
                lease_id=s.lease_id,
                reservation_id=s.reservation_id,
                from_host=None if s.old_host is None else str(s.old_host),
                to_host=None if s.new_host is None else str(s.new_host),
                handed_over=s.handed_over,
                error=s.error,
            )
            for s in report.healed
        ],
    )


@router.put(
    "/{host_id}/health",
    openapi_extra=body(HostHealthUpdate),
    responses=answers(200, HostHealthPublic, ONE | {413}),
)
def update_health(
    services: ServicesDep, actor: ActorDep, host_id: str, body: BodyDep
) -> JSONResponse:
    """Mark the host down (unreservable; its reservations healed at once) or up."""
    try:
        wanted = HostHealthUpdate.model_validate(json_object(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(field, first["msg"]) from exc
    if wanted.health == "down":
        report = services.healing.mark_down(actor, host_id, wanted.reason)
    else:
        report = services.healing.mark_up(actor, host_id)
    return JSONResponse(_health(report).model_dump(mode="json"))
