"""/v1/lease-series: recurring leases, one lease per occurrence (docs/series.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from climate import wire
from climate.api.deps import ActorDep, BodyDep
from climate.api.parsing import json_object, series_request
from climate.api.rendering import JSONResponse
from climate.api.schemas import body
from climate.api.schemas.answers import ONE, V1, WRITE, answers
from climate.api.schemas.bodies import SeriesCreate
from climate.api.schemas.lease_answers import SeriesAnswer, SeriesCreated, SeriesList
from climate.services.series import SeriesService

router = APIRouter(prefix="/v1/lease-series", tags=["lease-series"])


async def _series(request: Request) -> SeriesService:
    service: SeriesService = request.app.state.series
    return service


SeriesDep = Annotated[SeriesService, Depends(_series)]


@router.get("", responses=answers(200, SeriesList, V1))
def list_series(service: SeriesDep, actor: ActorDep, project_id: str | None = None) -> JSONResponse:
    found = service.list_all(actor, project_id=project_id)
    return JSONResponse({"series": [wire.series(row) for row in found]})


@router.post(
    "",
    status_code=201,
    openapi_extra=body(SeriesCreate),
    responses=answers(201, SeriesCreated, V1 | WRITE, creates=("series_id", "/series/id")),
)
def create_series(service: SeriesDep, actor: ActorDep, body: BodyDep) -> JSONResponse:
    """201 with the series, its occurrences and the occurrences ``skipped`` (``conflicts:
    skip``); all or nothing by default (a 409 lists every occurrence that does not fit)."""
    view = service.create(actor, series_request(json_object(body)))
    answer: dict[str, Any] = {
        "series": wire.series(view.series, view.leases),
        "skipped": [wire.skipped_occurrence(s) for s in view.skipped],
    }
    return JSONResponse(answer, status_code=201)


@router.get("/{series_id}", responses=answers(200, SeriesAnswer, ONE))
def show_series(service: SeriesDep, actor: ActorDep, series_id: str) -> JSONResponse:
    view = service.get(actor, series_id)
    return JSONResponse({"series": wire.series(view.series, view.leases)})


@router.delete("/{series_id}", status_code=204, responses=answers(204, None, ONE))
def delete_series(service: SeriesDep, actor: ActorDep, series_id: str) -> Response:
    """Cancel every occurrence not yet ended and delete the series."""
    service.delete(actor, series_id)
    return Response(status_code=204)
