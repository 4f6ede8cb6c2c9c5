"""Routers put on the app, each blocking handler's CPU time counted."""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from climate import metrics


def include(app: FastAPI, router: APIRouter) -> None:
    """``router``'s routes on the app's own router, as they are (each already has its router's
    prefix and tags), instead of ``app.include_router``: FastAPI (0.16x) keeps an included
    router as one route that, on every request, walks every router's version and matches its
    routes twice, a quarter of the CPU of a small request.

    A route whose handler blocks (``def``: FastAPI runs it on a worker thread) counts the CPU
    time of that thread while it runs, in ``climate_http_route_cpu_seconds_total``."""
    for route in router.routes:
        if not isinstance(route, APIRoute) or route.dependant.call in _TIMED:
            continue  # a router's routes are its module's: every app of a process shares them
        if route.dependant.call is not None and not inspect.iscoroutinefunction(
            route.dependant.call
        ):
            method = ",".join(sorted(route.methods or ()))
            # FastAPI reads the dependant's call on each request; the route's signature, from
            # which it solves the parameters, was read from the handler itself.
            route.dependant.call = _timed(route.dependant.call, route.path, method)
            _TIMED.add(route.dependant.call)
    app.router.routes.extend(router.routes)


_TIMED: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
"""The handlers put on by ``_timed``: another app of this process (the tests make many) finds
the same route objects, already counted."""


def _timed(handler: Callable[..., Any], route: str, method: str) -> Callable[..., Any]:
    counted = metrics.ROUTE_CPU_SECONDS.labels(route, method)

    def timed(**arguments: Any) -> Any:
        began = time.thread_time()
        try:
            return handler(**arguments)
        finally:
            counted.inc(time.thread_time() - began)

    return timed
