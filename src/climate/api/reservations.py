"""/v1/leases/{lease_id}/reservations/{reservation_id}/start and /acknowledge: a project's
actions on one reservation, as its start and end policies allow (docs/policies.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from climate import wire
from climate.api.deps import ActorDep
from climate.api.rendering import JSONResponse
from climate.api.schemas.answers import ONE, answers
from climate.api.schemas.lease_answers import LeaseAnswer
from climate.services.reservation_actions import ReservationActionService

router = APIRouter(prefix="/v1/leases/{lease_id}/reservations", tags=["leases"])


async def _actions(request: Request) -> ReservationActionService:
    actions: ReservationActionService = request.app.state.reservation_actions
    return actions


ActionsDep = Annotated[ReservationActionService, Depends(_actions)]


@router.post("/{reservation_id}/start", responses=answers(200, LeaseAnswer, ONE | {409}))
def start_reservation(
    actions: ActionsDep, actor: ActorDep, lease_id: str, reservation_id: str
) -> JSONResponse:
    """Start a manual reservation held since its lease started; 200 with the lease."""
    return JSONResponse({"lease": wire.lease(actions.start(actor, lease_id, reservation_id))})


@router.post("/{reservation_id}/acknowledge", responses=answers(200, LeaseAnswer, ONE | {409}))
def acknowledge_reservation(
    actions: ActionsDep, actor: ActorDep, lease_id: str, reservation_id: str
) -> JSONResponse:
    """Acknowledge a keep-until-ack reservation's end: what it kept is discarded."""
    lease = actions.acknowledge(actor, lease_id, reservation_id)
    return JSONResponse({"lease": wire.lease(lease)})
