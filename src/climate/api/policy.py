"""/v1/policy: the usage rules a project is held to, with its consumption (docs/fair-share.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from climate.api.deps import ActorDep
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.policy import PolicyUsage, RuleUsage
from climate.fairshare.report import UsageService
from climate.fairshare.rules import shown_limit, unit_of

router = APIRouter(prefix="/v1/policy", tags=["policy"])


async def _usage(request: Request) -> UsageService:
    service: UsageService = request.app.state.rules_usage
    return service


UsageDep = Annotated[UsageService, Depends(_usage)]


@router.get("/usage", response_model=PolicyUsage, responses=answers(200, PolicyUsage, V1))
def usage(
    service: UsageDep, actor: ActorDep, project_id: str | None = None, user_id: str | None = None
) -> PolicyUsage:
    """The caller's project (an admin: any, with ``project_id``); per-user figures are the
    caller's (or ``user_id``'s)."""
    report = service.usage(actor, project_id, user_id)
    return PolicyUsage(
        project_id=report.project_id,
        user_id=report.user_id,
        external_service=report.external_service,
        rules=[
            RuleUsage(
                rule=f.rule.name,
                kind=f.rule.kind.value,
                description=f.rule.describe(),
                limit=shown_limit(f.rule),
                unit=unit_of(f.rule),
                per=f.rule.per,
                resource_type=f.rule.resource_type,
                properties=f.rule.properties_text,
                exempt=f.exempt,
                current=None if f.current is None else round(f.current, 6),
                ahead=None if f.ahead is None else round(f.ahead, 6),
            )
            for f in report.figures
        ],
    )
