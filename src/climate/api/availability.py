"""/v1/availability: the earliest windows a lease would fit in, and a capacity timeline."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter

from climate import inputs, wire
from climate.api.deps import ActorDep, BodyDep, ServicesDep
from climate.api.parsing import json_object, parse_date
from climate.api.rendering import JSONResponse
from climate.api.schemas import body
from climate.api.schemas.answers import V1, answers
from climate.api.schemas.bodies import AvailabilitySearch
from climate.api.schemas.searches import CapacityTimelineAnswer, Windows
from climate.db import volumes as volume_rows
from climate.domain.formats import lease_dates
from climate.domain.requests import ReservationRequest
from climate.errors import InvalidInput
from climate.resources.kinds import Kind
from climate.services.availability import (
    HOST_TYPE,
    INSTANCE_TYPE,
    AvailabilityQuery,
    Capacity,
    Offer,
    OfferedReservation,
    TimelineQuery,
)

router = APIRouter(prefix="/v1/availability", tags=["availability"])

SEARCH_FIELDS = frozenset(
    {"reservations", "duration", "search_start", "search_end", "limit", "step"}
)
_CLOCK = re.compile(r"(\d{1,6}):([0-5]\d)")
VOLUME_TYPE = volume_rows.RESOURCE_TYPE
UNITS = {HOST_TYPE: "hosts", INSTANCE_TYPE: "instances", VOLUME_TYPE: "GB"}
"""What a timeline counts, besides items (their kind's plural)."""


@router.post(
    "",
    openapi_extra=body(AvailabilitySearch),
    responses=answers(200, Windows, V1 | {413}),
)
def search(services: ServicesDep, actor: ActorDep, body: BodyDep) -> JSONResponse:
    offers = services.availability.search(actor, _search_query(json_object(body)))
    kinds = {name: inventory.kind for name, inventory in services.items.items()}
    return JSONResponse({"windows": [_window(offer, kinds) for offer in offers]})


@router.get("/timeline", responses=answers(200, CapacityTimelineAnswer, V1))
def timeline(
    services: ServicesDep,
    actor: ActorDep,
    end: str | None = None,
    start: str | None = None,
    bucket: str | None = None,
    resource_type: str = TimelineQuery.resource_type,
    resource_properties: str = "",
    hypervisor_properties: str = "",
    pool: str | None = None,
    network_id: str | None = None,
    vcpus: str | None = None,
    memory_mb: str | None = None,
    disk_gb: str | None = None,
) -> JSONResponse:
    if end is None:
        raise InvalidInput("end", "required: the end of the timeline, a date")
    if pool is not None and network_id is not None:
        raise InvalidInput("network_id", "give pool or network_id, not both")
    query = TimelineQuery(
        end=parse_date("end", end),
        start=None if start in (None, "", "now") else parse_date("start", start),
        bucket=3600 if bucket is None else _integer("bucket", bucket),
        resource_type=resource_type,
        hypervisor_properties=hypervisor_properties,
        resource_properties=resource_properties,
        pool=pool if network_id is None else network_id,
        vcpus=None if vcpus is None else _integer("vcpus", vcpus),
        memory_mb=None if memory_mb is None else _integer("memory_mb", memory_mb),
        disk_gb=None if disk_gb is None else _integer("disk_gb", disk_gb),
    )
    capacity = services.availability.timeline(actor, query)
    items = services.items.get(capacity.resource_type)
    unit = UNITS.get(capacity.resource_type, "resources") if items is None else items.kind.plural
    return JSONResponse({"timeline": _timeline(capacity, unit)})


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
        if not value.strip().removeprefix("-").isdigit():
            raise InvalidInput(
                "duration", f"must be whole seconds or 'HH:MM', not {inputs.shown(value)}"
            )
    return _integer("duration", value)


def _integer(field: str, value: object) -> int:
    """Any bounded integer: the service checks the range each field takes."""
    return inputs.integer(field, value, minimum=-inputs.MAX_INT)


def _window(offer: Offer, kinds: Mapping[str, Kind]) -> dict[str, Any]:
    return {
        "start_date": wire.lease_date(offer.start),
        "end_date": wire.lease_date(offer.end),
        "reservations": [_offered(r, kinds.get(r.resource_type)) for r in offer.reservations],
        "usage_rules": list(offer.usage_rules),
    }


def _offered(r: OfferedReservation, kind: Kind | None) -> dict[str, Any]:
    """What one reservation would get: hosts (with names for those who may list them),
    instances per host, items by id and name (under their ``kind``'s name field), or GB from a
    pool."""
    p = r.params
    shown: dict[str, Any] = {"resource_type": r.resource_type, "available": r.available}
    if "min" in p:
        shown.update(min=p["min"], max=p["max"])
    else:
        shown["amount"] = p["amount"]
    if r.resource_type == HOST_TYPE:
        shown["hosts"] = [str(h) for h in r.resource_ids]
        if r.resource_names is not None:
            shown["host_names"] = list(r.resource_names)
    elif r.resource_type == INSTANCE_TYPE:
        shown["placement"] = [
            {"host": str(h), "count": n}
            | ({} if r.resource_names is None else {"host_name": r.resource_names[k]})
            for k, (h, n) in enumerate(zip(r.resource_ids, r.quantities, strict=True))
        ]
    elif r.resource_type == VOLUME_TYPE:
        shown.update(
            size_gb=p["size_gb"],
            pool=(r.resource_names or ("",))[0],
            pool_id=str(r.resource_ids[0]),
            gb=r.quantities[0],
        )
    elif kind is not None:
        names = r.resource_names or ("",) * len(r.resource_ids)
        shown["items"] = [
            {"id": str(i), kind.name_field: name}
            for i, name in zip(r.resource_ids, names, strict=True)
        ]
    return shown


def _timeline(capacity: Capacity, unit: str) -> dict[str, Any]:
    count = len(capacity.free)
    dates = lease_dates(capacity.start, dt.timedelta(seconds=capacity.bucket), count + 1)
    columns: dict[str, Sequence[Any]] = {"start_date": dates[:count], "free": capacity.free}
    if capacity.busy is not None and capacity.partly is not None:
        columns.update(busy=capacity.busy, partly_busy=capacity.partly)
    if capacity.largest is not None:
        columns["largest"] = capacity.largest
    keys = tuple(columns)
    buckets = [dict(zip(keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    found: dict[str, Any] = {
        "resource_type": capacity.resource_type,
        "unit": unit,
        "start_date": dates[0],
        "end_date": dates[count],
        "bucket": capacity.bucket,
        "total": capacity.total,
        "buckets": buckets,
    }
    if capacity.resource_type == HOST_TYPE:
        found["hosts"] = capacity.total
    return found
