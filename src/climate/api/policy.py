"""/v1/policy: the usage rules a project is held to, with its consumption (docs/fair-share.md),
and who the caller is, with the policy rules that hold for them (docs/policies.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from climate.api.auth import Authenticator
from climate.api.deps import ActorDep
from climate.api.parsing import id_filter
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.policy import Caller, CallerAnswer, PolicyUsage, RuleUsage
from climate.domain.actor import Actor
from climate.fairshare.report import UsageService
from climate.fairshare.rules import shown_limit, unit_of
from climate.policy import ADMIN, Policy

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
    report = service.usage(
        actor, id_filter("project_id", project_id), id_filter("user_id", user_id)
    )
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


async def _caller(request: Request) -> Actor | None:
    """The caller, or None when a token is needed (``auth`` token or keystone) and none was
    sent: the one question under /v1 answered without an identity, so that a client finds out
    that it must log in without a failed request. A token sent and refused is still a 401."""
    authenticate: Authenticator = request.app.state.authenticate
    if not authenticate.blocks:
        return authenticate(request)
    if not request.headers.get("x-auth-token"):
        return None
    return await run_in_threadpool(authenticate, request)


@router.get("/caller", response_model=CallerAnswer, responses=answers(200, CallerAnswer, V1))
def caller(request: Request, actor: Annotated[Actor | None, Depends(_caller)]) -> CallerAnswer:
    """Who the caller is and which policy rules hold for them on their own project (as the
    dashboard asks, instead of trying an admin's call and failing); ``caller`` is null when a
    token is needed and none was sent."""
    if actor is None:
        return CallerAnswer(caller=None)
    policy: Policy = request.app.state.policy
    owner = actor.owner()
    return CallerAnswer(
        caller=Caller(
            user_id=actor.user_id,
            project_id=actor.project_id,
            roles=sorted(actor.roles),
            admin=policy.allows(actor, ADMIN),
            allowed=sorted(rule for rule in policy.rules if policy.allows(actor, rule, owner)),
        )
    )
