"""The app factory: routes, Blazar's headers and error body, and the version document."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from climate import __version__
from climate.api import hosts, leases
from climate.api.auth import Authenticator
from climate.api.deps import Services
from climate.errors import ClimateError
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.tokens import TokenService

LOG = logging.getLogger(__name__)
API_VERSION_HEADER = "OpenStack-API-Version"
API_VERSION = "reservation 1.0"


def error_body(status: int, message: str, name: str) -> JSONResponse:
    """Blazar's error shape; the blazar CLI prints ``error_message``."""
    return JSONResponse(
        {"error_code": status, "error_message": message, "error_name": name}, status_code=status
    )


def create_app(ctx: ServiceContext) -> FastAPI:
    app = FastAPI(
        title="Climate", version=__version__, summary="Reservations, Blazar v1 compatible"
    )
    tokens = TokenService(ctx)
    app.state.services = Services(
        leases=LeaseService(ctx),
        hosts=HostService(ctx),
        tokens=tokens,
        max_body_bytes=ctx.settings.max_body_bytes,
    )
    app.state.authenticate = Authenticator(ctx.settings, tokens)
    app.include_router(leases.router)
    app.include_router(hosts.router)

    @app.middleware("http")
    async def openstack_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request_id = f"req-{uuid.uuid4()}"
        # PostgreSQL cannot compare text with NUL in it: such an id or filter matches nothing.
        params = request.query_params.multi_items()
        if "\x00" in request.url.path or any("\x00" in k + v for k, v in params):
            response: Response = error_body(
                400, "path or query: must not contain NUL characters", "INVALID_INPUT"
            )
        else:
            try:
                response = await call_next(request)
            except Exception:  # the catch-all handler would answer without our headers
                LOG.exception("unexpected error on %s %s", request.method, request.url.path)
                response = error_body(500, "Internal Server Error", "INTERNAL_SERVER_ERROR")
        response.headers[API_VERSION_HEADER] = API_VERSION
        response.headers["Vary"] = API_VERSION_HEADER
        response.headers["x-openstack-request-id"] = request_id
        return response

    @app.exception_handler(ClimateError)
    async def climate_error(_request: Request, exc: ClimateError) -> JSONResponse:
        if exc.status >= 500:
            LOG.error("%s: %s", exc.name, exc.message)
        return error_body(exc.status, exc.message, exc.name)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        return error_body(400, f"{field or 'request'}: {first.get('msg')}", "INVALID_INPUT")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}
        return error_body(exc.status_code, str(exc.detail), names.get(exc.status_code, "ERROR"))

    def versions(request: Request) -> JSONResponse:
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

    app.add_api_route("/", versions, methods=["GET"], include_in_schema=False)
    app.add_api_route("/versions", versions, methods=["GET"], include_in_schema=False)
    return app
