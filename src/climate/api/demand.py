"""``GET /v1/demand``: refused demand per resource type and properties over time, beside
utilisation, and how many more hosts would have admitted a share of it, as JSON or CSV
(``Accept: text/csv`` or ``format=csv``); periods as ``GET /v1/usage`` (docs/demand.md)."""

from __future__ import annotations

import csv
import io

from fastapi import APIRouter, Request, Response

from climate.api.deps import ActorDep
from climate.api.parsing import id_filter
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.demand import (
    CounterOfferShown,
    Demand,
    DemandBucket,
    DemandGroup,
    DemandPlan,
    DemandResponse,
    RefusalRecord,
)
from climate.api.usage import answer, asked_window
from climate.errors import InvalidInput
from climate.services import demand
from climate.services.demand import DemandService, Question

router = APIRouter(prefix="/v1/demand", tags=["usage"])
CSV_COLUMNS = (
    "resource_type",
    "properties",
    "bucket_start",
    "refused_requests",
    "refused_unit_hours",
    "reserved_hours",
    "capacity_hours",
)


@router.get(
    "",
    response_model=DemandResponse,
    responses=answers(200, DemandResponse, V1, media={"text/csv": {"schema": {"type": "string"}}}),
)
def get_demand(
    request: Request,
    actor: ActorDep,
    period: str | None = None,
    start: str | None = None,
    end: str | None = None,
    project_id: str | None = None,
    bucket: str = "day",
    resource_type: str | None = None,
    properties: str | None = None,
    target: str | None = None,
    format: str | None = None,
) -> Response:
    """Refused demand over ``period`` or ``start``-``end`` (as ``GET /v1/usage``), per ``bucket``
    (``day`` or ``hour``), of ``project_id`` (admins: any, default all; members: their own); with
    ``target`` (1-100), the fewest hosts like those matching ``properties`` that would have
    admitted that share of the refused host requests."""
    service: DemandService = request.app.state.demand
    asked = asked_window(service.ctx, period, start, end, format)
    question = Question(bucket, resource_type, properties, _percent(target))
    body = _body(service.report(actor, asked, question, id_filter("project_id", project_id)))
    return answer(request, format, body, _csv)


def _percent(target: str | None) -> int | None:
    if target is None:
        return None
    try:
        return int(target)
    except ValueError:
        raise InvalidInput("target", f"must be a whole percentage, not {target!r}") from None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _body(found: demand.Demand) -> DemandResponse:
    plan = None
    if found.planning is not None:
        p = found.planning
        plan = DemandPlan(
            resource_type="physical:host",
            properties=p.properties,
            template_host=p.template,
            target_percent=p.percent,
            measure="requests",
            replayed_requests=p.replayed,
            counted_requests=p.counted,
            needed_requests=p.plan.needed,
            extra_hosts=p.plan.extra,
            admitted_requests=p.plan.admitted,
            admitted_without_extra=p.plan.admitted_without,
        )
    return DemandResponse(
        demand=Demand(
            start=found.window.start.isoformat(),
            end=found.window.end.isoformat(),
            period=found.window.period,
            bucket="hour" if found.bucket == "hour" else "day",
            groups=[
                DemandGroup(
                    resource_type=g.resource_type,
                    properties=g.properties,
                    buckets=[
                        DemandBucket(
                            start=b.start.isoformat(),
                            refused_requests=b.refused,
                            refused_unit_hours=str(b.refused_hours),
                            reserved_hours=_text(b.reserved_hours),
                            capacity_hours=_text(b.capacity_hours),
                        )
                        for b in g.buckets
                    ],
                )
                for g in found.groups
            ],
            refusals=[
                RefusalRecord(
                    at=a.row.at.isoformat(),
                    project_id=a.row.project_id,
                    user_id=a.row.user_id,
                    lease_id=a.row.lease_id,
                    lease_name=a.row.lease_name,
                    step=a.row.step,  # type: ignore[arg-type]
                    outcome=a.row.outcome,  # type: ignore[arg-type]
                    reason=a.row.reason,
                    message=a.row.message,
                    resource_type=a.row.resource_type,
                    min=a.row.count_min,
                    max=a.row.count_max,
                    properties=a.row.properties,
                    start_date=a.row.start_date.isoformat(),
                    end_date=a.row.end_date.isoformat(),
                    offer=None if a.row.offer is None else CounterOfferShown(**a.row.offer),
                    offer_taken=a.taken,
                )
                for a in found.refusals
            ],
            plan=plan,
        )
    )


def _csv(body: DemandResponse) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for group in body.demand.groups:
        for b in group.buckets:
            writer.writerow(
                [
                    group.resource_type,
                    group.properties,
                    b.start,
                    b.refused_requests,
                    b.refused_unit_hours,
                    b.reserved_hours or "",
                    b.capacity_hours or "",
                ]
            )
    return out.getvalue()
