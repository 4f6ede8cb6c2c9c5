"""What a client asks of a lease, as values: a new lease, a change to one, a reservation."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from climate.domain.status import LeaseType


@dataclass(frozen=True)
class ReservationRequest:
    resource_type: str | None
    fields: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class RequestedWindow:
    """What a flexible lease asked for: ``duration`` somewhere in [earliest_start, latest_end]
    (kept on the lease it was placed in)."""

    earliest_start: dt.datetime
    latest_end: dt.datetime
    duration: dt.timedelta


@dataclass(frozen=True)
class LeaseRequest:
    name: str
    start: dt.datetime | None
    """None means now."""
    end: dt.datetime
    before_end: dt.datetime | None = None
    reservations: Sequence[ReservationRequest] = ()
    duration: dt.timedelta | None = None
    """A flexible window: the lease lasts this long, at the earliest start in [start, end]
    where it fits (``start`` and ``end`` are then ``earliest_start`` and ``latest_end``)."""
    dry_run: bool = False
    """Answer what would happen and write nothing."""
    lease_type: LeaseType = LeaseType.SCHEDULED
    priority: int | None = None
    """Place in the waiting queue (higher first); None: the default, 0."""
    retries: int | None = None
    """A retry lease's cap on admission attempts; None: ``retry_max_attempts``."""
    deadline: dt.datetime | None = None
    """When a best-effort lease stops hunting."""
    hold: dt.timedelta | None = None
    """Create a hold (HELD) that lapses after this long unless confirmed."""
    hold_field: str = "hold.expires_in"
    """The request's field that gave ``hold``, named when it is refused."""
    before_end_offset: dt.timedelta | None = None
    """The before-end event comes this long before the end (instead of ``before_end``)."""
    reminders: Sequence[dt.timedelta] | None = None
    """Extra notifications, each this long before the end."""
    series_id: str | None = None
    occurrence: dt.datetime | None = None
    """The instant of its series this lease is made for (``series_id``)."""
    requested_window: RequestedWindow | None = None
    """The flexible window this fixed request was placed in (kept on the lease)."""


@dataclass(frozen=True)
class LeaseChanges:
    name: str | None = None
    start: dt.datetime | None = None
    start_now: bool = False
    end: dt.datetime | None = None
    end_now: bool = False
    before_end: dt.datetime | None = None
    reservations: Sequence[ReservationRequest] = field(default_factory=tuple)
    before_end_offset: dt.timedelta | None = None
    reminders: Sequence[dt.timedelta] | None = None
    """None: keep the reminders' offsets (they move with the end); a list replaces them."""

    @property
    def none(self) -> bool:
        """Nothing to change (Blazar answers an empty update with the lease as it is)."""
        return self.name is None and self.keeps_all_but_the_name

    @property
    def renames_only(self) -> bool:
        """A new name and nothing else: Blazar renames a lease whatever its state."""
        return self.name is not None and self.keeps_all_but_the_name

    @property
    def keeps_all_but_the_name(self) -> bool:
        # The API gives reservations as a list, the default is a tuple.
        return replace(self, name=None, reservations=tuple(self.reservations)) == LeaseChanges()


class Conflicts(enum.StrEnum):
    """What creating a series does when some occurrences do not fit."""

    REJECT = "reject"
    """Create nothing; the 409 lists every occurrence that does not fit."""
    SKIP = "skip"
    """Create those that fit; the answer lists the others."""


@dataclass(frozen=True)
class SeriesRequest:
    name: str
    start: dt.datetime
    """The first occurrence's start (the rule's DTSTART); it must be an occurrence."""
    duration: dt.timedelta
    rrule: str
    exdates: Sequence[dt.datetime] = ()
    reservations: Sequence[ReservationRequest] = ()
    before_end_offset: dt.timedelta | None = None
    reminders: Sequence[dt.timedelta] | None = None
    conflicts: Conflicts = Conflicts.REJECT
