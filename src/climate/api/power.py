"""``GET /v1/power``: the power policy's report (admin; docs/power.md)."""

from __future__ import annotations

from fastapi import APIRouter

from climate.api.deps import ActorDep, ServicesDep
from climate.api.parsing import optional_date
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.power import PowerAnswer, power_answer

router = APIRouter(prefix="/v1/power", tags=["power"])


@router.get("", response_model=PowerAnswer, responses=answers(200, PowerAnswer, V1))
def power_report(
    services: ServicesDep, actor: ActorDep, start: str | None = None, end: str | None = None
) -> PowerAnswer:
    """Each host's power state, the policy's candidates, and the host-hours and energy saved
    within [start, end) (default: the last 30 days)."""
    report = services.power.report(actor, optional_date("start", start), optional_date("end", end))
    return power_answer(report)
