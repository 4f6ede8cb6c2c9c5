"""Request parsing: Blazar's loose JSON and date formats turned into typed values, or a 400."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from climate import inputs
from climate.domain.requests import Conflicts, ReservationRequest, SeriesRequest
from climate.errors import InvalidInput

_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")
# Dates are shifted by days around a window when planning; keep well clear of datetime.max.
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
SERIES_FIELDS = frozenset(
    {
        "name",
        "start_date",
        "end_date",
        "duration",
        "rrule",
        "exdates",
        "conflicts",
        "reservations",
        "events",
        "before_end_offset",
        "reminders",
    }
)
MAX_DURATION = inputs.MAX_INT
"""Seconds, as any integer field (68 years): any date plus or minus it stays within what a
datetime holds."""
_CLOCK = re.compile(r"(\d{1,6}):([0-5]\d)")
_ISO_DURATION = re.compile(r"P(?:(\d{1,6})D)?(?:T(?:(\d{1,7})H)?(?:(\d{1,9})M)?(?:(\d{1,10})S)?)?")
_FLAGS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (an empty body is an empty object): every route's
    one decoder. A key given twice in one object is refused, at any depth (which one would
    count is the parser's choice, not the client's); so are control characters in keys and
    strings (``check_text``)."""
    if not raw.strip():
        return {}
    # ValueError: also a bad encoding or an integer too long to convert; RecursionError: too deep.
    try:
        body = json.loads(raw, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput("body", f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInput("body", "must be a JSON object")
    check_text(body, "")
    return body


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise InvalidInput(
                inputs.printable(key), "given twice in one object; send each key once"
            )
        found[key] = value
    return found


def check_text(value: object, where: str) -> None:
    """No control characters in any key (``inputs.name_text``) or string (tabs and line
    feeds only, ``inputs.free_text``: the fields that are names check for those as well).
    NUL is among them: PostgreSQL cannot store it in text."""
    if isinstance(value, str):
        inputs.free_text(where or "body", value)
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else key
            inputs.name_text(inputs.printable(path), key)
            check_text(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{where}[{i}]")


def id_filter(field: str, value: str | None) -> str | None:
    """A report's ``project_id`` or ``user_id`` query: absent (the default), or an id, never
    blank (``project_id=`` with an unset variable would report nothing)."""
    if value is None:
        return None
    if not value.strip():
        raise InvalidInput(field, "must name one; leave it out for the default")
    return inputs.name_text(field, value)


_REQUIRED = "%Y-%m-%d %H:%M (or ISO 8601; UTC without an offset)"
"""Blazar's words for a date it cannot read, then the other form Climate reads."""


def parse_date(field: str, value: object) -> dt.datetime:
    """Blazar's ``YYYY-MM-DD HH:MM`` (UTC) or ISO 8601; without an offset a date is UTC."""
    if not isinstance(value, str):
        raise InvalidInput(field, f"expected a date like '2030-01-31 12:00', got {value!r}")
    if not value.strip():
        raise InvalidInput(field, f"{value} is an invalid date. Required format: {_REQUIRED}")
    parsed = _parse_utc(field, value, value.strip())
    if parsed >= LATEST:
        raise InvalidInput(field, f"{value!r} is too far ahead; dates must be before year 9000")
    return parsed


def _parse_utc(field: str, value: str, text: str) -> dt.datetime:
    # ISO 8601 first: it is what clients send most, and a failed ``strptime`` costs as much as
    # a whole ``fromisoformat``. Where both read a text, they read the same moment; Blazar's
    # formats are tried after it for what only ``strptime`` reads (``2030-1-5 3:04``).
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        for fmt in _FORMATS:
            try:
                return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
            except ValueError:
                continue
        raise InvalidInput(
            field, f"{inputs.printable(value)} is an invalid date. Required format: {_REQUIRED}"
        ) from exc
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError as exc:  # e.g. 9999-12-31T23:00-05:00 is past datetime.max in UTC
        raise InvalidInput(field, f"{value!r} is out of range") from exc


def optional_date(field: str, value: object) -> dt.datetime | None:
    return None if value in (None, "") else parse_date(field, value)


def _reject_unknown(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _no_events(body: Mapping[str, Any]) -> None:
    events = body.get("events") or []
    if not isinstance(events, list) or events:
        raise InvalidInput("events", "user-defined events are not supported; send []")


def before_end_offset(body: Mapping[str, Any]) -> dt.timedelta | None:
    """How long before the end the before-end event comes, instead of ``before_end_date``."""
    if body.get("before_end_offset") is None:
        return None
    if body.get("before_end_date") not in (None, ""):
        raise InvalidInput(
            "before_end_offset", "give either before_end_date or before_end_offset, not both"
        )
    return parse_duration("before_end_offset", body["before_end_offset"])


def parse_duration(field: str, value: object) -> dt.timedelta:
    """Whole seconds (a number or a string of digits), ``"HH:MM"`` or an ISO 8601 duration
    of days, hours, minutes and seconds (``"P1DT12H"``, ``"PT90M"``); shorter than
    ``MAX_DURATION`` either way."""
    text = value.strip() if isinstance(value, str) else ""
    clock = _CLOCK.fullmatch(text)
    iso = _ISO_DURATION.fullmatch(text.upper())
    if clock is not None:
        found = dt.timedelta(hours=int(clock.group(1)), minutes=int(clock.group(2)))
    elif iso is not None and any(iso.groups()) and not text.upper().endswith("T"):
        days, hours, minutes, secs = (int(g or 0) for g in iso.groups())
        found = dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=secs)
    elif isinstance(value, int) or text.removeprefix("-").isdigit():
        seconds = inputs.integer(field, value, minimum=-MAX_DURATION, maximum=MAX_DURATION)
        found = dt.timedelta(seconds=seconds)
    else:
        raise InvalidInput(
            field,
            f"must be whole seconds, 'HH:MM' or an ISO 8601 duration like 'PT2H', not "
            f"{inputs.shown(value)}",
        )
    if abs(found.total_seconds()) > MAX_DURATION:
        raise InvalidInput(
            field, f"must be at most {MAX_DURATION} seconds, not {inputs.shown(value)}"
        )
    return found


def durations(field: str, value: object) -> tuple[dt.timedelta, ...] | None:
    """A list of durations (None: not given), each named by its index in an error."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput(field, "must be a list of durations like 'PT1H'")
    return tuple(parse_duration(f"{field}[{i}]", v) for i, v in enumerate(value))


def flag(field: str, value: object) -> bool:
    """A boolean given as JSON or as text (``true``/``false``, ``1``/``0``, ``yes``/``no``)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    found = _FLAGS.get(value.strip().lower()) if isinstance(value, str) else None
    if found is None:
        raise InvalidInput(field, f"must be true or false, not {value!r}")
    return found


def series_request(body: Mapping[str, Any]) -> SeriesRequest:
    """A series to create: the first occurrence's ``start_date`` and its ``end_date`` (or a
    ``duration``), the ``rrule`` and ``exdates``, and the fields its leases share."""
    _reject_unknown(body, SERIES_FIELDS)
    _no_events(body)
    name = body.get("name")
    if not isinstance(name, str):
        raise InvalidInput("name", "required string")
    if "start_date" not in body:
        raise InvalidInput("start_date", "required: the first occurrence's start")
    start = parse_date("start_date", body["start_date"])
    if ("end_date" in body) == ("duration" in body):
        raise InvalidInput("end_date", "give either end_date or duration")
    if "end_date" in body:
        length = parse_date("end_date", body["end_date"]) - start
        if length <= dt.timedelta(0):
            raise InvalidInput("end_date", "must be after start_date")
    else:
        length = parse_duration("duration", body["duration"])
    rule = body.get("rrule")
    if not isinstance(rule, str):
        raise InvalidInput("rrule", "required, like 'FREQ=WEEKLY;BYDAY=TU;COUNT=8'")
    exdates = body.get("exdates") or []
    if not isinstance(exdates, list):
        raise InvalidInput("exdates", "must be a list of dates")
    conflicts = body.get("conflicts", Conflicts.REJECT.value)
    if conflicts not in {c.value for c in Conflicts}:
        raise InvalidInput("conflicts", f"must be 'reject' or 'skip', not {conflicts!r}")
    return SeriesRequest(
        name=name,
        start=start,
        duration=length,
        rrule=rule,
        exdates=tuple(parse_date(f"exdates[{i}]", at) for i, at in enumerate(exdates)),
        reservations=_series_reservations(body.get("reservations")),
        before_end_offset=before_end_offset(body),
        reminders=durations("reminders", body.get("reminders")),
        conflicts=Conflicts(conflicts),
    )


def _series_reservations(value: object) -> list[ReservationRequest]:
    """A series reserves something (a lease may have no reservations, as in Blazar)."""
    if not isinstance(value, list) or not value:
        raise InvalidInput("reservations", "a series needs a list of at least one reservation")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"reservations[{i}]", "must be an object")
        fields = dict(item)
        resource_type = fields.pop("resource_type", None)
        if resource_type is None:
            raise InvalidInput(f"reservations[{i}].resource_type", "required")
        found.append(ReservationRequest(resource_type, fields, fields.pop("id", None)))
    return found
