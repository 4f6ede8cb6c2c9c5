"""The rules of a lease's dates, pure: its window, its before-end instant, its reminders and the
events that carry them out (the event plan). Services apply them to rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from climate.domain.formats import duration
from climate.domain.status import EventType, LeaseType
from climate.errors import Forbidden, InvalidInput

START_TOLERANCE = dt.timedelta(seconds=60)
"""A start given as a date may lag the clock by this much (a client rounding "now" to the
minute)."""
MAX_REMINDERS = 10
"""How many reminders a lease may have (docs/lease-types.md)."""
WAITING_TYPES = frozenset({LeaseType.RETRY, LeaseType.BEST_EFFORT})
"""Lease types that wait in the queue (status IN_PROGRESS) when refused at creation."""


def check_start(start: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """The start asked for (None: now), not in the past. A start up to ``START_TOLERANCE``
    ago (the current minute, as ``blazar lease-create --start-date`` gives it) is now: the
    lease's resources are booked from when it was asked, not from a moment already gone, in
    which a lease deleted since may still have held them."""
    if start is None:
        return now
    if start < now - START_TOLERANCE:
        raise InvalidInput(
            "start_date",
            f"Start date must be later than current date ({start.isoformat()} is in the past; "
            "use 'now' or a future date)",
        )
    return max(start, now)


def check_window(
    start: dt.datetime, end: dt.datetime, blazar: str = "End date must be later than start date."
) -> None:
    """``blazar``: Blazar's words for an inverted window (its update says it differently)."""
    if end <= start:
        raise InvalidInput(
            "end_date",
            f"{blazar} ({end.isoformat()} is not after start_date {start.isoformat()})",
        )


def before_end(
    given: dt.datetime | None,
    start: dt.datetime,
    end: dt.datetime,
    offset: dt.timedelta | None,
    default: dt.timedelta,
) -> dt.datetime:
    """The before-end instant: ``offset`` before the end, else ``given``, else ``default``
    before the end (not before the start)."""
    if offset is not None:
        if not dt.timedelta(0) <= offset <= end - start:
            raise InvalidInput(
                "before_end_offset", f"must be between 0 and the lease's length ({end - start})"
            )
        return end - offset
    if given is not None:
        if not start < given < end:
            # Blazar's refusal, a 403 (its NotAuthorized), for an instant not inside the lease.
            raise Forbidden(
                "before_end_date: Datetime is out of lease limits (it must lie after start_date "
                "and before end_date)"
            )
        return given
    return max(end - default, start)


def check_reminders(
    offsets: Sequence[dt.timedelta],
    start: dt.datetime,
    end: dt.datetime,
    before_end: dt.datetime | None,
    *,
    given: bool,
    started: bool,
) -> tuple[dt.timedelta, ...]:
    """The reminders' offsets, longest first. ``given``: the client sent them (errors name
    each); else they are the lease's own, kept as its window changes: one longer than a
    running lease has passed (it is skipped), but a lease that has not started must be
    longer than each of its reminders."""
    if len(offsets) > MAX_REMINDERS:
        raise InvalidInput("reminders", f"at most {MAX_REMINDERS}, not {len(offsets)}")
    seen: dict[dt.timedelta, int] = {}
    for i, offset in enumerate(offsets):
        where = f"reminders[{i}]" if given else "reminders"
        shown = duration(offset)
        if offset <= dt.timedelta(0):
            raise InvalidInput(where, f"must be a positive duration, not {shown}")
        if offset > end - start and (given or not started):
            raise InvalidInput(where, f"{shown} is longer than the lease ({duration(end - start)})")
        if offset in seen:
            raise InvalidInput(where, f"{shown} repeats reminders[{seen[offset]}]")
        if end - offset == before_end:
            raise InvalidInput(where, f"{shown} falls on before_end_date, which notifies already")
        seen[offset] = i
    return tuple(sorted(offsets, reverse=True))


def stored_reminders(offsets: Sequence[dt.timedelta]) -> list[int] | None:
    """Reminders' offsets as a lease keeps them: whole seconds, longest first."""
    return sorted((int(o.total_seconds()) for o in offsets), reverse=True) or None


@dataclass(frozen=True)
class PlannedEvent:
    kind: EventType
    time: dt.datetime
    reminder: bool = False
    """A before-end event that only notifies."""


def event_plan(
    start: dt.datetime,
    end: dt.datetime,
    before_end: dt.datetime | None,
    reminders: Sequence[dt.timedelta] = (),
) -> list[PlannedEvent]:
    """A lease's start, before-end and end events, and a reminder per offset, in time order."""
    wanted = [
        (EventType.START_LEASE, start),
        (EventType.END_LEASE, end),
        (EventType.BEFORE_END_LEASE, before_end),
    ]
    plan = [PlannedEvent(kind, when) for kind, when in wanted if when is not None]
    plan.extend(PlannedEvent(EventType.BEFORE_END_LEASE, end - o, True) for o in reminders)
    return sorted(plan, key=lambda p: p.time)
