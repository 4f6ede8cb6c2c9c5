"""/v1/leases"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from climate import metrics, wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep, SortedPageDep, WriteDep
from climate.api.parsing import flag
from climate.api.rendering import JSONResponse
from climate.api.reservations import ActionsDep
from climate.api.schemas import body, validated
from climate.api.schemas.answers import ONE, V1, WRITE, answers
from climate.api.schemas.idle import (
    HeartbeatAnswer,
    IdleAnswer,
    IdleUpdate,
    heartbeat_answer,
    idle_answer,
)
from climate.api.schemas.lease_answers import LeaseAnswer, LeaseCreated, LeaseDryRun, Leases
from climate.api.schemas.leases import LeaseCreate, LeaseUpdate

router = APIRouter(prefix="/v1/leases", tags=["leases"])


@router.get("", responses=answers(200, Leases, V1))
def list_leases(
    services: ServicesDep,
    actor: ActorDep,
    page: SortedPageDep,
    project_id: str | None = None,
    status: str | None = None,
    name: str | None = None,
) -> Response:
    renders = services.lease_renders
    shown = services.leases.list_revised(
        actor, renders.get, project_id=project_id, status=status, name=name, page=page
    )
    return Response(renders.body(shown), media_type="application/json")


@router.post(
    "",
    status_code=201,
    openapi_extra=body(LeaseCreate),
    responses=answers(
        201,
        LeaseCreated,
        V1 | WRITE,
        also={200: LeaseDryRun},
        creates=("lease_id", "/lease/id"),
    ),
)
def create_lease(call: WriteDep, dry_run: str | None = None) -> JSONResponse:
    """201 with the lease; a dry run (``?dry_run=true``) 200 with the lease it would be (a
    waiting one with the queue position it would take). A flexible window's request comes back
    as ``requested_window`` (as the lease also shows it)."""
    services, actor = call.services, call.actor
    request = validated(LeaseCreate, call.body).request(flag("dry_run", dry_run))
    if request.dry_run:
        trial = services.leases.dry_run(actor, request)
        lease, position = trial.lease, trial.queue_position
    else:
        with metrics.ADMISSION_SECONDS.time():
            lease, position = services.leases.create(actor, request), None
    answer: dict[str, Any] = {"lease": wire.lease(lease, position)}
    if request.duration is not None:
        answer["requested_window"] = answer["lease"]["requested_window"]
    if request.dry_run:
        answer["dry_run"] = True
        if trial.quote is not None:
            answer["quote"] = str(trial.quote)
        return JSONResponse(answer)
    return JSONResponse(answer, status_code=201)


@router.get("/{lease_id}", responses=answers(200, LeaseAnswer, ONE))
def show_lease(services: ServicesDep, actor: ActorDep, lease_id: str) -> Response:
    renders = services.lease_renders
    shown = services.leases.get_revised(actor, lease_id, renders.get)
    return Response(b'{"lease":' + renders.one(shown) + b"}", media_type="application/json")


@router.put(
    "/{lease_id}", openapi_extra=body(LeaseUpdate), responses=answers(200, LeaseAnswer, ONE | WRITE)
)
def update_lease(actions: ActionsDep, actor: ActorDep, lease_id: str, raw: BodyDep) -> JSONResponse:
    lease = actions.update_lease(actor, lease_id, validated(LeaseUpdate, raw).changes())
    return JSONResponse({"lease": wire.lease(lease)})


@router.delete("/{lease_id}", status_code=204, responses=answers(204, None, ONE))
def delete_lease(actions: ActionsDep, actor: ActorDep, lease_id: str) -> Response:
    """Delete the lease; what its ended keep-until-ack reservations kept is discarded first."""
    actions.delete_lease(actor, lease_id)
    return Response(status_code=204)


@router.post("/{lease_id}/confirm", responses=answers(200, LeaseAnswer, ONE | {409}))
def confirm_lease(services: ServicesDep, actor: ActorDep, lease_id: str) -> JSONResponse:
    """Confirm a hold: the HELD lease becomes PENDING and starts at its start date."""
    return JSONResponse({"lease": wire.lease(services.leases.confirm(actor, lease_id))})


@router.post(
    "/{lease_id}/heartbeat",
    response_model=HeartbeatAnswer,
    responses=answers(200, HeartbeatAnswer, ONE | {409}),
)
def heartbeat(services: ServicesDep, actor: ActorDep, lease_id: str) -> HeartbeatAnswer:
    """The running lease is in use now: idle reclamation counts its idleness from here
    (docs/idle.md)."""
    return heartbeat_answer(services.idle.heartbeat(actor, lease_id))


@router.put(
    "/{lease_id}/idle",
    response_model=IdleAnswer,
    responses=answers(200, IdleAnswer, ONE | {413}),
    openapi_extra=body(IdleUpdate),
)
def exempt_from_idle(
    services: ServicesDep, actor: ActorDep, lease_id: str, raw: BodyDep
) -> IdleAnswer:
    """Exempt the lease from idle reclamation, or no longer (admin)."""
    wanted = validated(IdleUpdate, raw)
    return idle_answer(services.idle.exempt(actor, lease_id, wanted.exempt))
