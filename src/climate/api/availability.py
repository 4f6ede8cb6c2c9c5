"""/v1/availability: the earliest windows a lease would fit in, and a capacity timeline."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from climate import wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep
from climate.api.parsing import json_object, parse_date
from climate.errors import InvalidInput
from climate.services.availability import AvailabilityQuery, Capacity, Offer, TimelineQuery
from climate.services.leases import ReservationRequest

router = APIRouter(prefix="/v1/availability", tags=["availability"])

SEARCH_FIELDS = frozenset(
    {"reservations", "duration", "search_start", "search_end", "limit", "step"}
)
_CLOCK = re.compile(r"(\d{1,6}):([0-5]\d)")


@router.post("")
def search(services: ServicesDep, actor: ActorDep, body: BodyDep) -> JSONResponse:
    offers = services.availability.search(actor, _search_query(json_object(body)))
    return JSONResponse({"windows": [_window(offer) for offer in offers]})


@router.get("/timeline")
def timeline(
    services: ServicesDep,
    actor: ActorDep,
    end: str | None = None,
    start: str | None = None,
    bucket: str | None = None,
    resource_properties: str = "",
    hypervisor_properties: str = "",
) -> JSONResponse:
    if end is None:
        raise InvalidInput("end", "required: the end of the timeline, a date")
    query = TimelineQuery(
        end=parse_date("end", end),
        start=None if start in (None, "", "now") else parse_date("start", start),
        bucket=3600 if bucket is None else _integer("bucket", bucket),
        hypervisor_properties=hypervisor_properties,
        resource_properties=resource_properties,
    )
    return JSONResponse({"timeline": _timeline(services.availability.timeline(actor, query))})


def _search_query(body: dict[str, Any]) -> AvailabilityQuery:
    unknown = sorted(set(body) - SEARCH_FIELDS)
    if unknown:
        allowed = ", ".join(sorted(SEARCH_FIELDS))
        raise InvalidInput(unknown[0], f"unknown field; allowed: {allowed}")
    for required in ("reservations", "duration", "search_end"):
        if required not in body:
            raise InvalidInput(required, "required")
    start = body.get("search_start")
    return AvailabilityQuery(
        reservations=_reservations(body["reservations"]),
        duration=_duration(body["duration"]),
        search_start=None if start in (None, "", "now") else parse_date("search_start", start),
        search_end=parse_date("search_end", body["search_end"]),
        limit=_integer("limit", body.get("limit", 3)),
        step=_integer("step", body.get("step", 60)),
    )


def _reservations(value: object) -> list[ReservationRequest]:
    """As in a lease: objects with a ``resource_type`` and that type's fields."""
    if not isinstance(value, list):
        raise InvalidInput("reservations", "must be a list")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"reservations[{i}]", "must be an object")
        fields = dict(item)
        resource_type = fields.pop("resource_type", None)
        if resource_type is None:
            raise InvalidInput(f"reservations[{i}].resource_type", "required")
        found.append(ReservationRequest(resource_type, fields))
    return found


def _duration(value: object) -> int:
    """Seconds, as a number or a string of digits, or "HH:MM"."""
    if isinstance(value, str):
        clock = _CLOCK.fullmatch(value.strip())
        if clock is not None:
            return int(clock.group(1)) * 3600 + int(clock.group(2)) * 60
    try:
        return _integer("duration", value)
    except InvalidInput:
        raise InvalidInput("duration", f"must be whole seconds or 'HH:MM', not {value!r}") from None


def _integer(field: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18:
        return value
    text = value.strip() if isinstance(value, str) else ""
    digits = text.removeprefix("-")
    # isascii: isdigit also accepts "²"; the length: int() refuses thousands of digits.
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:
        return int(text)
    raise InvalidInput(field, f"must be an integer, not {value!r}")


def _window(offer: Offer) -> dict[str, Any]:
    reservations = []
    for r in offer.reservations:
        shown: dict[str, Any] = {
            "resource_type": r.resource_type,
            "min": r.min,
            "max": r.max,
            "available": r.available,
            "hosts": [str(h) for h in r.resource_ids],
        }
        if r.resource_names is not None:
            shown["host_names"] = list(r.resource_names)
        reservations.append(shown)
    return {
        "start_date": wire.lease_date(offer.start),
        "end_date": wire.lease_date(offer.end),
        "reservations": reservations,
    }


def _timeline(capacity: Capacity) -> dict[str, Any]:
    step = dt.timedelta(seconds=capacity.bucket)
    return {
        "start_date": wire.lease_date(capacity.start),
        "end_date": wire.lease_date(capacity.start + step * len(capacity.free)),
        "bucket": capacity.bucket,
        "hosts": capacity.hosts,
        "buckets": [
            {
                "start_date": wire.lease_date(capacity.start + step * i),
                "free": free,
                "busy": busy,
                "partly_busy": partly,
            }
            for i, (free, busy, partly) in enumerate(
                zip(capacity.free, capacity.busy, capacity.partly, strict=True)
            )
        ],
    }
