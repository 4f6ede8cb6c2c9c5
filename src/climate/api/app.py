"""The app factory: routes, Blazar's headers and error body, and the version document."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from climate import __version__, metrics, wire
from climate.api import (
    audit,
    availability,
    credits,
    demand,
    hosts,
    instances,
    items,
    leases,
    openapi,
    operations,
    ops,
    policy,
    power,
    reservations,
    routes,
    schemas,
    series,
    templates,
    ui,
    usage,
)
from climate.api.auth import Authenticator
from climate.api.deps import Services
from climate.api.observe import ObservedRequests
from climate.api.rendering import JSONResponse
from climate.api.scheduling import RequestScheduler
from climate.api.schemas.answers import ANYONE, answers
from climate.api.schemas.ops import Versions
from climate.backends import load_backend
from climate.backends.base import Timeboxed
from climate.context import ServiceContext
from climate.domain.admission import AdmissionRefused
from climate.entropy import random_bytes
from climate.errors import (
    ClimateError,
    NotEnoughCapacity,
    NotEnoughCredits,
    UsageRuleBroken,
    database_words,
)
from climate.fairshare.report import UsageService as RulesUsageService
from climate.resources.capabilities import item_kinds
from climate.services.audit import AuditService
from climate.services.availability import AvailabilityService
from climate.services.credits import CreditsService
from climate.services.demand import DemandService
from climate.services.healing import HealingService
from climate.services.health import HealthService
from climate.services.hosts import HostService
from climate.services.idle import IdleService
from climate.services.instances import InstanceAllocationService
from climate.services.items import ItemService
from climate.services.leases import LeaseService
from climate.services.power import PowerService
from climate.services.reservation_actions import ReservationActionService
from climate.services.series import SeriesService
from climate.services.tokens import TokenService
from climate.services.usage import UsageService
from climate.services.volume_pools import VolumePoolService

LOG = logging.getLogger(__name__)
API_VERSION_HEADER = "OpenStack-API-Version"
API_VERSION = "reservation 1.0"


ROUTING_ERRORS = {
    404: "The requested URL was not found on the server. If you entered the URL manually please "
    "check your spelling and try again.",
    405: "The method is not allowed for the requested URL.",
}


def error_body(status: int, message: str, details: Mapping[str, Any] | None = None) -> JSONResponse:
    """Blazar's error shape (the blazar CLI prints ``error_message``; ``error_name`` is the
    status again, as Blazar sends it), with ``details`` added."""
    body = {**(details or {}), "error_code": status, "error_message": message, "error_name": status}
    return JSONResponse(body, status_code=status)


class OpenStackHeaders:
    """Blazar's response headers on every answer (500s included), and a 400 for NUL bytes in the
    path or query. Plain ASGI: a ``BaseHTTPMiddleware`` costs a task and a queue per request."""

    def __init__(
        self, app: ASGIApp, storage_problem: Callable[[BaseException], str | None]
    ) -> None:
        self.app = app
        self.storage_problem = storage_problem
        """``disk full: ...`` or ``database is read-only: ...`` for a database error, else None."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = [
            (b"openstack-api-version", API_VERSION.encode()),
            (b"vary", API_VERSION_HEADER.encode()),
            (
                b"x-openstack-request-id",
                f"req-{uuid.UUID(bytes=random_bytes(16), version=4)}".encode(),
            ),
        ]
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        # PostgreSQL cannot compare text with NUL in it: such an id or filter matches nothing.
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            response = error_body(400, "path or query: must not contain NUL characters")
            await response(scope, receive, send_with_headers)
            return
        try:
            await self.app(scope, receive, send_with_headers)
        except ClientDisconnect:  # gone, or cut off by the body read timeout: nobody to answer
            LOG.debug("client left during %s %s", scope["method"], scope["path"])
        except Exception as exc:  # the catch-all handler would answer without our headers
            problem = self.storage_problem(exc)
            if problem is not None:
                # The operator's to fix, not a fault of the code: one line, no traceback. (A
                # read-only PostgreSQL is not an OperationalError: looked for in every error.)
                LOG.error(
                    "%s on %s %s: %s", problem, scope["method"], scope["path"], database_words(exc)
                )
                response = error_body(503, STORAGE_MESSAGE.format(problem=problem))
                response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER)
            elif isinstance(exc, DATABASE_UNAVAILABLE):
                LOG.error(
                    "database unavailable on %s %s: %s",
                    scope["method"],
                    scope["path"],
                    database_words(exc),
                    exc_info=exc,
                )
                response = error_body(503, UNAVAILABLE_MESSAGE)
                response.headers["Retry-After"] = "1"
            else:
                LOG.exception("unexpected error on %s %s", scope["method"], scope["path"])
                response = error_body(500, "Internal Server Error")
            if started:
                raise
            await response(scope, receive, send_with_headers)


DATABASE_UNAVAILABLE = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
)
"""The database, not the request: its connection lost or refused (PostgreSQL restarted, a
backend terminated), no connection free in the pool, or SQLite unable to write (the file
read-only, the disk full, locked past the busy timeout). The next request gets a new
connection."""
UNAVAILABLE_MESSAGE = (
    "database unavailable (its connection was lost or it refused the operation); try again. "
    "A change whose answer this is may or may not have been made: look before repeating it"
)


STORAGE_MESSAGE = (
    "{problem}. The change was not made (nothing was written); reads go on. Try again once "
    "an operator has made room or made the database writable"
)
STORAGE_RETRY_AFTER = 30
"""Seconds: a full disk or a read-only database lasts until someone acts."""


def create_app(ctx: ServiceContext) -> FastAPI:
    app = FastAPI(
        title="Climate",
        version=__version__,
        summary="Reservations, Blazar v1 compatible",
        default_response_class=JSONResponse,
        # As Blazar: /v1/leases/ is not /v1/leases (a 404, not a redirect a client may follow
        # into a create or a delete).
        redirect_slashes=False,
    )
    tokens = TokenService(ctx)
    kinds = item_kinds(ctx.resource_types)
    backend = load_backend(ctx.settings)
    timeboxed = Timeboxed(backend, ctx.settings.backend_timeout_seconds)
    app.state.services = Services(
        leases=LeaseService(ctx),
        hosts=HostService(ctx, timeboxed),
        tokens=tokens,
        audit=AuditService(ctx),
        availability=AvailabilityService(ctx),
        items={name: ItemService(ctx, kind) for name, kind in kinds.items()},
        volume_pools=VolumePoolService(ctx),
        instances=InstanceAllocationService(ctx),
        healing=HealingService(ctx, timeboxed),
        power=PowerService(ctx, timeboxed),
        idle=IdleService(ctx),
        max_body_bytes=ctx.settings.max_body_bytes,
    )
    app.state.resource_types = ctx.resource_types
    app.state.authenticate = Authenticator(ctx.settings, tokens)
    app.state.policy = ctx.policy
    app.state.series = SeriesService(ctx, app.state.services.leases)
    app.state.reservation_actions = ReservationActionService(ctx, backend)
    app.state.health = HealthService(ctx)
    app.state.usage = UsageService(ctx)
    app.state.demand = DemandService(ctx)
    app.state.rules_usage = RulesUsageService(ctx)
    app.state.credits = CreditsService(ctx)
    routes.include(app, templates.router)
    routes.include(app, leases.router)
    routes.include(app, series.router)
    routes.include(app, reservations.router)
    routes.include(app, hosts.router)
    routes.include(app, audit.router)
    routes.include(app, operations.router)
    routes.include(app, availability.router)
    for kind in kinds.values():
        routes.include(app, items.item_router(kind))
    routes.include(app, items.pools)
    routes.include(app, instances.router)
    routes.include(app, power.router)
    ui.install(app, ctx)
    routes.include(app, policy.router)
    routes.include(app, credits.router)
    routes.include(app, ops.router)
    routes.include(app, usage.router)
    routes.include(app, demand.router)
    app.add_middleware(
        RequestScheduler,
        slots=ctx.settings.request_slots,
        lend_after=ctx.settings.request_lend_ms / 1000.0,
        max_wait=ctx.settings.request_max_wait_ms / 1000.0,
        max_body=ctx.settings.max_body_bytes,
    )
    app.add_middleware(OpenStackHeaders, storage_problem=ctx.db.storage_problem)
    app.add_middleware(ObservedRequests)

    @app.exception_handler(ClimateError)
    async def climate_error(_request: Request, exc: ClimateError) -> JSONResponse:
        if exc.status >= 500:
            LOG.error("%s: %s", exc.name, exc.message)
        details: dict[str, Any] | None = None
        if isinstance(exc, AdmissionRefused):
            details = wire.refused(exc.refused)
        elif isinstance(exc, NotEnoughCredits):
            figures = {"balance": exc.balance, "quote": exc.quote, "shortfall": exc.shortfall}
            details = {"rules": list(exc.rules), **figures}
        elif isinstance(exc, UsageRuleBroken):
            details = {"rules": list(exc.rules)}
        if isinstance(exc, NotEnoughCapacity):
            metrics.refused(details)
        response = error_body(exc.status, exc.message, details)
        if exc.status == 401:
            response.headers.update(app.state.authenticate.challenge)
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_body(400, schemas.error_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing's own errors, in Blazar's words and with its ``error`` key (its Flask app
        # answers them with werkzeug's descriptions).
        message = ROUTING_ERRORS.get(exc.status_code, str(exc.detail))
        response = error_body(exc.status_code, message, {"error": exc.status_code})
        if exc.status_code == 405:
            response.headers["Allow"] = openapi.allowed_methods(app, request.scope["path"])
        return response

    async def versions(request: Request) -> JSONResponse:
        base = str(request.base_url)
        document = {
            "versions": [
                {
                    "id": "v1.0",
                    "status": "CURRENT",
                    "links": [{"href": f"{base}v1", "rel": "self"}],
                    "min_version": "1.0",
                    "max_version": "1.0",
                }
            ]
        }
        return JSONResponse(document, status_code=300)

    shown = answers(300, Versions, ANYONE)
    app.add_api_route("/", versions, methods=["GET"], status_code=300, responses=shown)
    app.add_api_route("/versions", versions, methods=["GET"], status_code=300, responses=shown)
    openapi.install(app)
    return app
