"""Operator recovery: /v1/leases/{id}/retry and /v1/leases/{id}/force-end (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from climate import wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep
from climate.api.rendering import JSONResponse
from climate.api.schemas import body, validated
from climate.api.schemas.answers import ONE, WRITE, answers
from climate.api.schemas.lease_answers import LeaseAnswer
from climate.api.schemas.leases import ForceEnd
from climate.services.operations import OperatorService

router = APIRouter(prefix="/v1/leases", tags=["operations"])


async def _operator(services: ServicesDep) -> OperatorService:
    return OperatorService(services.leases.ctx)


OperatorDep = Annotated[OperatorService, Depends(_operator)]


@router.post("/{lease_id}/retry", responses=answers(200, LeaseAnswer, ONE | {409}))
def retry_lease(operator: OperatorDep, actor: ActorDep, lease_id: str) -> JSONResponse:
    return JSONResponse({"lease": wire.lease(operator.retry(actor, lease_id))})


@router.post(
    "/{lease_id}/force-end",
    openapi_extra=body(ForceEnd, required=False),
    responses=answers(200, LeaseAnswer, ONE | WRITE),
)
def force_end_lease(
    operator: OperatorDep, actor: ActorDep, lease_id: str, raw: BodyDep
) -> JSONResponse:
    options = validated(ForceEnd, raw)
    lease = operator.force_end(actor, lease_id, skip_backend=options.skip_backend)
    return JSONResponse({"lease": wire.lease(lease)})
