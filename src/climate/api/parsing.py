"""Request parsing: Blazar's loose JSON and date formats turned into typed values, or a 400."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from climate.errors import InvalidInput
from climate.services.leases import LeaseChanges, LeaseRequest, ReservationRequest

_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")
# Dates are shifted by days around a window when planning; keep well clear of datetime.max.
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
LEASE_FIELDS = frozenset(
    {"name", "start_date", "end_date", "before_end_date", "reservations", "events"}
)
# Blazar's documented update request carries "events": [] as well.
UPDATE_FIELDS = frozenset(
    {"name", "start_date", "end_date", "before_end_date", "reservations", "events"}
)


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (an empty body is an empty object)."""
    if not raw.strip():
        return {}
    # ValueError: also a bad encoding or an integer too long to convert; RecursionError: too deep.
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput("body", f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInput("body", "must be a JSON object")
    _reject_nul(body, "")
    return body


def _reject_nul(value: object, where: str) -> None:
    """NUL characters in any key or string (PostgreSQL cannot store them in text)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidInput(where or "body", "must not contain NUL characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if "\x00" in key:
                raise InvalidInput(where or "body", "field names must not contain NUL characters")
            _reject_nul(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _reject_nul(item, f"{where}[{i}]")


def parse_date(field: str, value: object) -> dt.datetime:
    """Blazar's ``YYYY-MM-DD HH:MM`` (UTC) or ISO 8601; without an offset a date is UTC."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, f"expected a date like '2030-01-31 12:00', got {value!r}")
    parsed = _parse_utc(field, value, value.strip())
    if parsed >= LATEST:
        raise InvalidInput(field, f"{value!r} is too far ahead; dates must be before year 9000")
    return parsed


def _parse_utc(field: str, value: str, text: str) -> dt.datetime:
    for fmt in _FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    except ValueError as exc:
        raise InvalidInput(
            field, f"{value!r} is not a date; use 'YYYY-MM-DD HH:MM' (UTC) or ISO 8601"
        ) from exc
    except OverflowError as exc:  # e.g. 9999-12-31T23:00-05:00 is past datetime.max in UTC
        raise InvalidInput(field, f"{value!r} is out of range") from exc


def optional_date(field: str, value: object) -> dt.datetime | None:
    return None if value in (None, "") else parse_date(field, value)


def _reject_unknown(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _reservations(value: object, *, creating: bool) -> list[ReservationRequest]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("reservations", "must be a list")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"reservations[{i}]", "must be an object")
        fields = dict(item)
        resource_type = fields.pop("resource_type", None)
        reservation_id = fields.pop("id", None)
        if creating and resource_type is None:
            raise InvalidInput(f"reservations[{i}].resource_type", "required")
        if reservation_id is not None and not isinstance(reservation_id, str):
            raise InvalidInput(f"reservations[{i}].id", "must be a string")
        found.append(ReservationRequest(resource_type, fields, reservation_id))
    return found


def _no_events(body: Mapping[str, Any]) -> None:
    events = body.get("events") or []
    if not isinstance(events, list) or events:
        raise InvalidInput("events", "user-defined events are not supported; send []")


def lease_request(body: Mapping[str, Any]) -> LeaseRequest:
    _reject_unknown(body, LEASE_FIELDS)
    if "end_date" not in body:
        raise InvalidInput("end_date", "required")
    _no_events(body)
    name = body.get("name")
    if not isinstance(name, str):
        raise InvalidInput("name", "required string")
    start_raw = body.get("start_date", "now")
    return LeaseRequest(
        name=name,
        start=None if start_raw in ("now", None) else parse_date("start_date", start_raw),
        end=parse_date("end_date", body["end_date"]),
        before_end=optional_date("before_end_date", body.get("before_end_date")),
        reservations=_reservations(body.get("reservations"), creating=True),
    )


def lease_changes(body: Mapping[str, Any]) -> LeaseChanges:
    _reject_unknown(body, UPDATE_FIELDS)
    if not body:
        raise InvalidInput("body", "no values to update")
    _no_events(body)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidInput("name", "must be a string")
    start_raw = body.get("start_date")
    return LeaseChanges(
        name=name,
        start=None if start_raw in (None, "now") else parse_date("start_date", start_raw),
        start_now=start_raw == "now",
        end=optional_date("end_date", body.get("end_date")),
        before_end=optional_date("before_end_date", body.get("before_end_date")),
        reservations=_reservations(body.get("reservations"), creating=False),
    )
