"""Every HTTP request counted (``climate_http_requests_total`` by route template, method and
status, and its duration) and written to the access log. Plain ASGI around the whole app, so
500s and 404s are seen too."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from climate import metrics
from climate.logs import ACCESS


class ObservedRequests:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            seconds = time.perf_counter() - began
            # The router puts the matched route in the scope; its path is the template.
            route = getattr(scope.get("route"), "path", metrics.UNMATCHED)
            method = scope["method"]
            metrics.REQUESTS.labels(route, method, str(status)).inc()
            metrics.REQUEST_SECONDS.labels(route).observe(seconds)
            if not ACCESS.disabled:
                client = scope.get("client")
                fields = {
                    "method": method,
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(seconds * 1000.0, 1),
                    "client": client[0] if client else "",
                }
                ACCESS.info(
                    "%s %s %d %.1f ms", method, scope["path"], status, seconds * 1000, extra=fields
                )
