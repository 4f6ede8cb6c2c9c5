"""What the lease routes answer: a lease as ``wire.lease`` renders it (the models describe it;
``wire.py`` renders it, since notifications carry the same bytes), and its wrappers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from climate.api.schemas import component
from climate.api.schemas.refusals import CounterOffer, Omitted, RefusalReason
from climate.api.schemas.shapes import (
    LEASE_DATE,
    Count,
    LeaseDate,
    Positive,
    Record,
    Stamp,
    Uuid,
    one_of,
)
from climate.domain.status import EventStatus, EventType, LeaseStatus, LeaseType

AnyReservation = Annotated[dict[str, Any], WithJsonSchema(component("AnyReservation"))]


class Event(Record):
    id: Uuid
    lease_id: Uuid
    status: Annotated[str, one_of(*EventStatus)]
    event_type: Annotated[str, one_of(*EventType)]
    time: LeaseDate
    attempts: Count
    last_error: str | None
    created_at: Stamp
    updated_at: Stamp | None


class RequestedWindow(Record):
    earliest_start: Annotated[
        str,
        WithJsonSchema({"anyOf": [{"const": "now"}, {"type": "string", "pattern": LEASE_DATE}]}),
    ]
    latest_end: LeaseDate
    duration: Positive = Field(description="seconds")


class Lease(Record):
    id: Uuid
    name: str
    start_date: LeaseDate
    end_date: LeaseDate
    status: Annotated[str, one_of(*LeaseStatus)]
    status_reason: str | None
    degraded: bool
    user_id: str
    project_id: str
    trust_id: str | None
    created_at: Stamp
    updated_at: Stamp | None
    reservations: list[AnyReservation]
    events: list[Event]
    lease_type: Annotated[str, one_of(*LeaseType)]
    priority: int = Field(description="waiting queue priority")
    queue_position: Positive | None = Field(
        description="a waiting (IN_PROGRESS) lease's place in the queue, from 1"
    )
    attempts: Count = Field(description="admission attempts")
    retries: int | None = Field(description="a retry lease's cap on attempts")
    next_attempt_at: LeaseDate | None
    deadline: LeaseDate | None
    hold_expires_at: LeaseDate | None
    before_end_date: LeaseDate | None
    reminders: list[str] = Field(description="ISO 8601 durations before the end, longest first")
    series_id: str | None = Field(description="the series this lease is an occurrence of")
    occurrence: LeaseDate | None = Field(
        description="its series' instant (kept when the lease moves)"
    )
    requested_window: RequestedWindow | None = Field(
        description="the flexible window it was placed in; null for fixed dates"
    )


class LeaseAnswer(Record):
    lease: Lease


class Leases(Record):
    leases: list[Lease]


class LeaseCreated(Record):
    lease: Lease
    requested_window: RequestedWindow | None = None


class LeaseDryRun(Record):
    """The lease as it would be created; nothing was written."""

    lease: Lease
    requested_window: RequestedWindow | None = None
    dry_run: Literal[True]
    quote: str | None = Field(
        None,
        description="with credits on: what the lease costs, encumbered if created "
        "(docs/credits.md)",
    )


class FromTemplate(Record):
    lease: Lease
    warnings: list[str] = Field(description="the template's resources not reserved, one each")


class SeriesOccurrence(Record):
    lease_id: Uuid
    occurrence: LeaseDate
    start_date: LeaseDate
    end_date: LeaseDate
    status: Annotated[str, one_of(*LeaseStatus)]


class Series(BaseModel):
    """Occurrences and cancelled: shown for one series, not in a list."""

    model_config = ConfigDict(extra="forbid")

    id: Uuid
    name: str
    project_id: str
    user_id: str
    rrule: str
    exdates: list[LeaseDate]
    start_date: LeaseDate
    end_date: LeaseDate
    duration: Positive = Field(description="seconds")
    reservations: list[dict[str, Any]]
    before_end_offset: str | None
    reminders: list[str]
    created_at: Stamp
    updated_at: Stamp | None
    occurrences: list[SeriesOccurrence] | Omitted = None
    cancelled: list[LeaseDate] | Omitted = Field(
        None, description="occurrences whose lease was deleted"
    )


class SkippedOccurrence(Record):
    """An occurrence that did not fit, with a lease's refusal."""

    occurrence: LeaseDate
    end_date: LeaseDate
    error_message: str
    reason: RefusalReason
    offers: Annotated[list[CounterOffer], Field(max_length=3)]


class SeriesAnswer(Record):
    series: Series


class SeriesList(Record):
    series: list[Series]


class SeriesCreated(Record):
    series: Series
    skipped: list[SkippedOccurrence]
