"""A refused lease's explanation, as ``wire.refused`` renders it into Blazar's error body: why
(``reason``) and up to three counter-offers (``offers``), docs/admission.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from climate.api.schemas.shapes import Count, LeaseDate, Positive, Record

Omitted = SkipJsonSchema[None]
"""Absent when it does not apply (never null)."""


class BusyUntil(Record):
    date: LeaseDate
    count: Positive


class ReservationRefusal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: Count
    resource_type: str
    rule: Literal["fits", "too_few_match", "too_few_free", "shared", "unexplained"]
    min: Count | Omitted = None
    max: Count | Omitted = None
    matching: Count | Omitted = None
    free: Count | Omitted = None
    available: Count | Omitted = None
    busy: Count | Omitted = None
    busy_until: list[BusyUntil] | Omitted = None
    enough_free_by: LeaseDate | Omitted = None


class RefusalReason(Record):
    """Per reservation: how many resources match, are free for the whole window, are left after
    the reservations before it, are busy and until when; and which rule refused it. Counts and
    times only."""

    start_date: LeaseDate
    end_date: LeaseDate
    reservations: list[ReservationRefusal]


class CounterOffer(Record):
    kind: Literal["later_start", "fewer_hosts", "shorter"]
    below_request: bool
    lease: Annotated[
        dict[str, Any],
        Field(
            description="a complete LeaseCreate body: POST it to /v1/leases to accept; for a "
            "refused update, a LeaseUpdate body: PUT it to the same lease"
        ),
    ]
