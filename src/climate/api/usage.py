"""``GET /v1/usage``: reserved and used unit-hours and their price, per project, as JSON or CSV
(``Accept: text/csv`` or ``format=csv``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from climate.api.deps import ActorDep
from climate.api.parsing import id_filter, parse_date
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.usage import ProjectUsage, Usage, UsageLine, UsageResponse
from climate.context import ServiceContext
from climate.errors import InvalidInput
from climate.services import usage
from climate.services.usage import UsageService

router = APIRouter(prefix="/v1/usage", tags=["usage"])
Body = TypeVar("Body", bound=BaseModel)
CSV_COLUMNS = (
    "project_id",
    "resource_type",
    "unit",
    "price_rule",
    "price",
    "reserved_hours",
    "used_hours",
    "reserved_amount",
    "used_amount",
)


@router.get(
    "",
    response_model=UsageResponse,
    responses=answers(200, UsageResponse, V1, media={"text/csv": {"schema": {"type": "string"}}}),
)
def get_usage(
    request: Request,
    actor: ActorDep,
    period: str | None = None,
    start: str | None = None,
    end: str | None = None,
    project_id: str | None = None,
    format: str | None = None,
) -> Response:
    """Usage over ``period`` (``day`` or ``month``, holding ``start``, default now) or the
    custom range ``start``-``end``; of ``project_id`` (admins: any, default all; members: their
    own)."""
    service: UsageService = request.app.state.usage
    asked = asked_window(service.ctx, period, start, end, format)
    body = _body(service.report(actor, asked, id_filter("project_id", project_id)))
    return answer(request, format, body, _csv)


def asked_window(
    ctx: ServiceContext, period: str | None, start: str | None, end: str | None, format: str | None
) -> usage.Window:
    """The period a report's query asks for (and its ``format`` checked), as ``GET /v1/usage``
    reads them (docs/usage.md); a bad one is a 400 naming the field."""
    if format not in (None, "json", "csv"):
        raise InvalidInput("format", f"must be json or csv, not {format!r}")
    return usage.window(
        period,
        None if start is None else parse_date("start", start),
        None if end is None else parse_date("end", end),
        ctx.clock.now(),
        ctx.settings.usage_max_days,
    )


def answer(
    request: Request, format: str | None, body: Body, to_csv: Callable[[Body], str]
) -> Response:
    """A report as CSV (``format=csv`` or ``Accept: text/csv``) or JSON."""
    if format == "csv" or (format is None and "text/csv" in request.headers.get("accept", "")):
        return Response(to_csv(body), media_type="text/csv")
    return Response(body.model_dump_json(), media_type="application/json")


def _body(found: usage.Usage) -> UsageResponse:
    return UsageResponse(
        usage=Usage(
            start=found.window.start.isoformat(),
            end=found.window.end.isoformat(),
            period=found.window.period,
            projects=[
                ProjectUsage(
                    project_id=p.project_id,
                    reserved_amount=str(p.reserved_amount),
                    used_amount=str(p.used_amount),
                    lines=[
                        UsageLine(
                            resource_type=line.resource_type,
                            unit=line.unit,
                            price_rule=line.rule,
                            price=str(line.price),
                            reserved_hours=str(line.reserved.quantize(usage.HOURS)),
                            used_hours=str(line.used.quantize(usage.HOURS)),
                            reserved_amount=str(line.reserved_amount),
                            used_amount=str(line.used_amount),
                        )
                        for line in p.lines
                    ],
                )
                for p in found.projects
            ],
        )
    )


def _csv(body: UsageResponse) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for project in body.usage.projects:
        for line in project.lines:
            writer.writerow(
                [
                    project.project_id,
                    line.resource_type,
                    line.unit,
                    line.price_rule,
                    line.price,
                    line.reserved_hours,
                    line.used_hours,
                    line.reserved_amount,
                    line.used_amount,
                ]
            )
    return out.getvalue()
