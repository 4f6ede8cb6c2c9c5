"""The OpenAPI document: FastAPI's, generated from the routes' pydantic models.

Routes declare their request bodies (``schemas.body``) and their answers
(``schemas.answers.answers``); this module adds the decoration FastAPI has no word for: links
from what a POST creates to the operations on it, no 422 (this app answers a bad parameter with
a 400, Blazar's error body), and the reservation unions of the app's resource types
(``app.state.resource_types``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import compile_path

from climate.api.schemas import components, schemas
from climate.api.schemas.answers import CREATES
from climate.api.schemas.reservations import unions
from climate.resources.base import ResourceType


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's generated document, with links, without 422s, with every component."""
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    links: list[tuple[str, str, str, Any]] = []
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            # FastAPI declares a 422 for parameter errors; this app answers them with a 400.
            operation["responses"].pop("422", None)
            for status, response in operation["responses"].items():
                creates = response.pop(CREATES, None)
                if creates is not None:
                    links.append((method, path, status, creates))
    for method, path, status, (parameter, pointer) in links:
        response = spec["paths"][path][method]["responses"][status]
        response["links"] = _links(spec["paths"], parameter, pointer)
    found = spec.setdefault("components", {}).setdefault("schemas", {})
    for generated in ("HTTPValidationError", "ValidationError"):
        found.pop(generated, None)
    resource_types: Mapping[str, ResourceType] = app.state.resource_types
    found.update(schemas(_bodies(spec["paths"]), *unions(resource_types)))
    written: dict[str, Any] = json.loads(components(json.dumps(spec)))
    return written


def _bodies(paths: Mapping[str, Any]) -> set[str]:
    """The components the operations' request bodies refer to (``schemas.body``), by name."""
    return {
        media["schema"]["$ref"].removeprefix("#/components/schemas/")
        for methods in paths.values()
        for operation in methods.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
    }


def _links(paths: Mapping[str, Any], parameter: str, pointer: str) -> dict[str, Any]:
    """Links from a created resource to every operation that takes its id as ``parameter``."""
    return {
        operation["operationId"]: {
            "operationId": operation["operationId"],
            "parameters": {parameter: f"$response.body#{pointer}"},
        }
        for path, methods in paths.items()
        if f"{{{parameter}}}" in path
        for operation in methods.values()
    }


def install(app: FastAPI) -> None:
    """Serve ``document(app)`` at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def allowed_methods(app: FastAPI, path: str) -> str:
    """The ``Allow`` header of a 405: every method the document lists for a path matching
    ``path`` (Starlette names only those of the first route that matches it)."""
    found = {
        method.upper()
        for template, methods in app.openapi()["paths"].items()
        if compile_path(template)[0].match(path)
        for method in methods
    }
    return ", ".join(sorted(found))
