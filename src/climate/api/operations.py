"""Operator recovery: /v1/leases/{id}/retry and /v1/leases/{id}/force-end (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from climate import wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep
from climate.api.parsing import json_object
from climate.errors import InvalidInput
from climate.services.operations import OperatorService

router = APIRouter(prefix="/v1/leases", tags=["operations"])


async def _operator(services: ServicesDep) -> OperatorService:
    return OperatorService(services.leases.ctx)


OperatorDep = Annotated[OperatorService, Depends(_operator)]


@router.post("/{lease_id}/retry")
def retry_lease(operator: OperatorDep, actor: ActorDep, lease_id: str) -> JSONResponse:
    return JSONResponse({"lease": wire.lease(operator.retry(actor, lease_id))})


@router.post("/{lease_id}/force-end")
def force_end_lease(
    operator: OperatorDep, actor: ActorDep, lease_id: str, body: BodyDep
) -> JSONResponse:
    options = json_object(body)
    unknown = set(options) - {"skip_backend"}
    if unknown:
        raise InvalidInput(sorted(unknown)[0], "unknown field; only skip_backend is accepted")
    skip_backend = options.get("skip_backend", False)
    if not isinstance(skip_backend, bool):
        raise InvalidInput("skip_backend", "must be true or false")
    lease = operator.force_end(actor, lease_id, skip_backend=skip_backend)
    return JSONResponse({"lease": wire.lease(lease)})
