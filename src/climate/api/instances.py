"""/v1/instances/allocations: which instance reservations run on which host."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from climate.api.allocation_renders import allocation
from climate.api.deps import ActorDep, PageDep, ServicesDep
from climate.api.hosts import FiltersDep
from climate.api.rendering import JSONResponse
from climate.api.schemas import inventory
from climate.api.schemas.answers import ONE, V1, answers
from climate.services.hosts import HostAllocations

router = APIRouter(prefix="/v1/instances", tags=["instances"])
ONE_HOST, HOSTS = inventory.allocations(inventory.HostInstances)


@router.get("/allocations", responses=answers(200, HOSTS, V1))
def list_allocations(
    services: ServicesDep, actor: ActorDep, filters: FiltersDep, page: PageDep
) -> Response:
    """A page of the hosts with instance allocations (by id; ``marker`` is a ``resource_id``),
    each with the instance reservations on it and their ``count``."""
    found = services.instances.allocations(actor, page=page, **filters.as_arguments())
    return Response(services.instance_renders.body(found), media_type="application/json")


@router.get("/allocations/{host_id}", responses=answers(200, ONE_HOST, ONE))
def show_allocation(
    services: ServicesDep, actor: ActorDep, host_id: str, filters: FiltersDep
) -> JSONResponse:
    """One host's instance reservations (none is an empty list; an unknown host a 404)."""
    found = services.instances.allocations(actor, host_id=host_id, **filters.as_arguments())
    return JSONResponse({"allocation": _allocation(found[0])})


def _allocation(found: HostAllocations) -> dict[str, object]:
    return allocation(found.host_id, found.reservations, "count")
