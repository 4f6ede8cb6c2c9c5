"""The web dashboard: its page and assets at /ui, the timeline it draws (``/v1/timeline``) and
the calendar feed (``/v1/leases.ics``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from pydantic_core import to_json
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from climate.api import ics, routes
from climate.api.deps import ActorDep
from climate.api.parsing import parse_date
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.ui import TimelineAnswer
from climate.context import ServiceContext
from climate.services.timeline import HOST_TYPE, TimelineService

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""Everything from Climate itself, nothing inline: data shown on the page cannot run."""
PAGE_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]

router = APIRouter(tags=["dashboard"])


async def _timelines(request: Request) -> TimelineService:
    service: TimelineService = request.app.state.timeline
    return service


TimelinesDep = Annotated[TimelineService, Depends(_timelines)]


@router.get(
    "/v1/timeline", response_model=TimelineAnswer, responses=answers(200, TimelineAnswer, V1)
)
def timeline(
    timelines: TimelinesDep,
    actor: ActorDep,
    start: str | None = None,
    end: str | None = None,
    resource_type: str = HOST_TYPE,
) -> Response:
    """Who holds which resource when: rows of resources, bars of allocations. Other projects'
    bookings come as bars with no lease (busy). Serialised straight from plain rows (tens of
    thousands of them for a month of a thousand hosts; ``TimelineAnswer`` documents them)."""
    found = timelines.timeline(
        actor,
        resource_type,
        start=None if start in (None, "", "now") else parse_date("start", start),
        end=None if end in (None, "") else parse_date("end", end),
    )
    answer = {
        "timeline": {
            "resource_type": found.resource_type,
            "start": int(found.start.timestamp()),
            "end": int(found.end.timestamp()),
            "now": int(found.now.timestamp()),
            "resources": [
                {"id": str(r.id), "name": r.name, "reservable": r.reservable, "pool": r.pool}
                for r in found.resources
            ],
            "leases": [lease._asdict() for lease in found.leases],
            "bars": [
                {"resource": r, "start": s, "end": e, "amount": a, "lease": lease}
                for r, s, e, a, lease in found.bars
            ],
        }
    }
    return Response(to_json(answer), media_type="application/json")


@router.get(
    "/v1/leases.ics",
    response_class=Response,
    responses=answers(
        200,
        None,
        V1,
        description="an iCalendar document (RFC 5545)",
        media={"text/calendar": {"schema": {"type": "string"}}},
    ),
)
def lease_feed(timelines: TimelinesDep, actor: ActorDep, project_id: str | None = None) -> Response:
    """The caller's project's leases as an iCalendar feed (an admin's: every project's, or
    ``project_id``'s)."""
    leases = timelines.feed(actor, project_id)
    name = f"Climate leases ({project_id or actor.project_id})"
    body = ics.calendar(leases, timelines.ctx.clock.now(), name)
    return Response(body, media_type=ics.MEDIA_TYPE)


class _PageHeaders:
    """The dashboard's files with a Content-Security-Policy and no sniffing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *PAGE_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI, ctx: ServiceContext) -> None:
    """Serve the dashboard at /ui and the endpoints behind it."""
    app.state.timeline = TimelineService(ctx)
    routes.include(app, router)
    # The API redirects no path to its slashed twin (Blazar answers 404), but the page's own.
    app.add_route("/ui", _to_page, include_in_schema=False)  # Starlette's: not an API route
    app.mount("/ui", _PageHeaders(StaticFiles(directory=STATIC, html=True)), name="ui")


async def _to_page(_request: Request) -> RedirectResponse:
    return RedirectResponse("/ui/")
