"""/v1/projects/{project_id}/credits and /ledger: a project's credits (docs/credits.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from climate import inputs
from climate.api.deps import ActorDep, BodyDep
from climate.api.schemas import body, validated
from climate.api.schemas.answers import V1, WRITE, answers
from climate.api.schemas.credits import (
    CreditGrant,
    CreditsAnswer,
    EntryAnswer,
    LedgerAnswer,
    account_answer,
    entry,
)
from climate.services.credits import CreditsService

router = APIRouter(prefix="/v1/projects/{project_id}", tags=["credits"])


async def _credits(request: Request) -> CreditsService:
    service: CreditsService = request.app.state.credits
    return service


CreditsDep = Annotated[CreditsService, Depends(_credits)]


@router.get("/credits", response_model=CreditsAnswer, responses=answers(200, CreditsAnswer, V1))
def show_credits(service: CreditsDep, actor: ActorDep, project_id: str) -> CreditsAnswer:
    """The project's balance and what its leases hold encumbered (members: their own)."""
    return account_answer(service.account(actor, project_id))


@router.post(
    "/credits",
    status_code=201,
    response_model=EntryAnswer,
    responses=answers(201, EntryAnswer, V1 | WRITE),
    openapi_extra=body(CreditGrant),
)
def grant_credits(
    service: CreditsDep, actor: ActorDep, project_id: str, raw: BodyDep
) -> EntryAnswer:
    """Grant credits (admin); a negative amount takes them back, never below zero (409)."""
    asked = validated(CreditGrant, raw)
    return EntryAnswer(entry=entry(service.grant(actor, project_id, asked.amount, asked.note)))


@router.get("/ledger", response_model=LedgerAnswer, responses=answers(200, LedgerAnswer, V1))
def show_ledger(
    service: CreditsDep,
    actor: ActorDep,
    project_id: str,
    limit: str | None = None,
    marker: str | None = None,
) -> LedgerAnswer:
    """The project's ledger, oldest first (``limit``, ``marker``: the last entry id seen)."""
    count = None if limit is None else inputs.integer("limit", limit, minimum=1)
    after = None if marker is None else inputs.integer("marker", marker, minimum=0)
    found = service.ledger(actor, project_id, count, after)
    return LedgerAnswer(ledger=[entry(w) for w in found])
