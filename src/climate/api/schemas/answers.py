"""What a route answers, for the OpenAPI document: its success body's model, the error statuses
it can give (each Blazar's error body), and Blazar's response headers on all of them.

A route declares ``responses=answers(...)``; FastAPI writes the document from it. Bodies that
``wire.py`` renders keep being rendered there (notifications share them byte for byte); their
models only describe them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from climate.api.schemas.lease_answers import SkippedOccurrence
from climate.api.schemas.refusals import CounterOffer, RefusalReason

CREATES = "x-climate-creates"
"""A success response's marker: the path parameter naming what it created and where its body
holds the value (a JSON pointer); ``openapi.document`` turns it into links."""
ERROR_MEANINGS = {
    400: "a field is missing, malformed or out of range (the message names it)",
    401: "no identity, or an unknown, expired or revoked token",
    403: "a policy rule refuses this caller",
    404: "no such resource (or one of another project)",
    409: "valid, but the current state refuses it",
    413: "the request body is larger than max_body_bytes",
    500: "an unexpected error",
}
RESPONSE_HEADERS: dict[str, Any] = {
    "OpenStack-API-Version": {
        "description": "the microversion that answered",
        "schema": {"type": "string", "const": "reservation 1.0"},
    },
    "x-openstack-request-id": {
        "description": "an id for this request, for the logs",
        "schema": {"type": "string", "pattern": "^req-"},
    },
}
# 400 everywhere: a NUL byte in the path or query is refused before routing. Under /v1 every
# call needs an identity (401) and passes a policy rule the operator may tighten (403).
ANYONE = frozenset({400})
V1 = frozenset({400, 401, 403})
ONE = V1 | {404}
WRITE = frozenset({409, 413})


class Error(BaseModel):
    """Blazar's error body; a refused lease or lease update (409, not enough resources) adds
    reason and offers (docs/admission.md)."""

    model_config = ConfigDict(extra="forbid")

    error_code: int = Field(description="the HTTP status")
    error_message: str = Field(description="for 4xx, names the field")
    error_name: int = Field(description="the HTTP status, as Blazar")
    error: int | SkipJsonSchema[None] = Field(
        None, description="a routing error (no such path, or method): the status, as Blazar"
    )
    reason: RefusalReason | SkipJsonSchema[None] = None
    offers: Annotated[list[CounterOffer], Field(max_length=3)] | SkipJsonSchema[None] = None
    conflicts: list[SkippedOccurrence] | SkipJsonSchema[None] = Field(
        None, description="a refused series: every occurrence that does not fit"
    )
    rules: list[dict[str, Any]] | SkipJsonSchema[None] = Field(
        None,
        description="refused by usage rules (403): each rule broken, or the external "
        "service's decision, or the credits the lease lacks (docs/fair-share.md, "
        "docs/credits.md)",
    )
    balance: str | SkipJsonSchema[None] = Field(None, description="credits: the balance")
    quote: str | SkipJsonSchema[None] = Field(None, description="credits: the lease's quote")
    shortfall: str | SkipJsonSchema[None] = Field(None, description="credits: what is missing")


def answers(
    status: int,
    model: type[BaseModel] | None,
    errors: frozenset[int],
    *,
    description: str | None = None,
    also: dict[int, type[BaseModel]] | None = None,
    media: dict[str, Any] | None = None,
    creates: tuple[str, str] | None = None,
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route: ``status`` with ``model``'s body (None: no body), ``also``
    other successes, ``media`` other media types of the success body, and ``errors`` (500 is
    always among them)."""
    ok: dict[str, Any] = {
        "description": description or _describe(model),
        "headers": RESPONSE_HEADERS,
    }
    if model is not None:
        ok["model"] = model
    if media:
        ok["content"] = media
    if creates is not None:
        ok[CREATES] = list(creates)
    found: dict[int | str, dict[str, Any]] = {status: ok}
    for other, body in (also or {}).items():
        found[other] = {"model": body, "description": _describe(body), "headers": RESPONSE_HEADERS}
    for code in sorted(errors | {500}):
        found[code] = {
            "model": Error,
            "description": ERROR_MEANINGS[code],
            "headers": RESPONSE_HEADERS,
        }
    return found


def _describe(model: type[BaseModel] | None) -> str:
    return "no content" if model is None else model.__name__
