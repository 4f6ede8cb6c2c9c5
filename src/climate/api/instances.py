"""/v1/instances/allocations: which instance reservations run on which host."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from climate.api.deps import ActorDep, ServicesDep
from climate.api.hosts import FiltersDep
from climate.api.items import _reservation
from climate.services.instances import HostInstances

router = APIRouter(prefix="/v1/instances", tags=["instances"])


@router.get("/allocations")
def list_allocations(services: ServicesDep, actor: ActorDep, filters: FiltersDep) -> JSONResponse:
    """Hosts (by id) with the instance reservations on them, each with its ``count``."""
    found = services.instances.allocations(actor, **filters.as_arguments())
    return JSONResponse({"allocations": [_allocation(a) for a in found]})


def _allocation(found: HostInstances) -> dict[str, object]:
    return {
        "resource_id": str(found.host_id),
        "reservations": [
            _reservation(r.reservation_id, r.lease_id, r.start, r.end, count=r.count)
            for r in found.reservations
        ],
    }
