"""Leases as an iCalendar document (RFC 5545): one VEVENT per lease, in UTC."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable

from climate import __version__
from climate.db.timeline import LeaseRow
from climate.domain.status import LeaseStatus

MEDIA_TYPE = "text/calendar; charset=utf-8"
_LINE_OCTETS = 75
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS = {
    LeaseStatus.PENDING: "TENTATIVE",
    LeaseStatus.HELD: "TENTATIVE",
    LeaseStatus.IN_PROGRESS: "TENTATIVE",
    LeaseStatus.ERROR: "CANCELLED",
    LeaseStatus.TIMEDOUT: "CANCELLED",
    LeaseStatus.EXPIRED: "CANCELLED",
}
"""iCalendar's event status per lease status; the others (starting, active, ending, ended)
are CONFIRMED."""


def calendar(leases: Iterable[LeaseRow], now: dt.datetime, name: str) -> str:
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        f"PRODID:-//Climate//Climate {__version__}//EN",
        "CALSCALE:GREGORIAN",
        "METHOD:PUBLISH",
        f"X-WR-CALNAME:{text(name)}",
    ]
    for lease in leases:
        lines += [
            "BEGIN:VEVENT",
            f"UID:{lease.id}@climate",
            f"DTSTAMP:{_utc(now)}",
            f"DTSTART:{_utc(lease.start)}",
            f"DTEND:{_utc(lease.end)}",
            f"SUMMARY:{text(lease.name)}",
            f"STATUS:{_STATUS.get(LeaseStatus(lease.status), 'CONFIRMED')}",
            "DESCRIPTION:"
            + text(f"Climate lease {lease.id}\nproject {lease.project_id}\nstatus {lease.status}"),
            "END:VEVENT",
        ]
    lines.append("END:VCALENDAR")
    return "".join(_folded(line) + "\r\n" for line in lines)


def text(value: str) -> str:
    """A TEXT value: backslash, semicolon and comma escaped, newlines as ``\\n``, other control
    characters (not allowed in TEXT) dropped."""
    value = value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,")
    value = value.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    return _CONTROL.sub("", value)


def _utc(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def _folded(line: str) -> str:
    """Lines longer than 75 octets split before a character that would cross the limit, each
    continuation starting with a space (never inside a UTF-8 sequence)."""
    parts: list[str] = []
    current = ""
    size = 0
    limit = _LINE_OCTETS
    for char in line:
        width = len(char.encode())
        if size + width > limit:
            parts.append(current)
            current, size, limit = "", 0, _LINE_OCTETS - 1
        current += char
        size += width
    parts.append(current)
    return "\r\n ".join(parts)
