"""The body of ``GET /v1/demand``: unit-hours as decimal strings (exact, never floats)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

DecimalText = str


class DemandBucket(BaseModel):
    start: str = Field(description="ISO 8601, UTC: the bucket's start (it ends at the next one)")
    refused_requests: int = Field(description="refused requests whose window starts here")
    refused_unit_hours: DecimalText = Field(
        description="unit-hours the refused requests asked for (their min) within the bucket"
    )
    reserved_hours: DecimalText | None = Field(
        description="physical:host only: host-hours reserved on the matching hosts"
    )
    capacity_hours: DecimalText | None = Field(
        description="physical:host only: the matching reservable hosts' hours"
    )


class DemandGroup(BaseModel):
    resource_type: str
    properties: str = Field(description="the requests' resource_properties, as sent")
    buckets: list[DemandBucket]


class CounterOfferShown(BaseModel):
    kind: str = Field(description="later_start, fewer_hosts or shorter")
    start: str
    end: str
    min: int | None = None
    max: int | None = None


class RefusalRecord(BaseModel):
    at: str = Field(description="when it was refused, timed out or lapsed (ISO 8601, UTC)")
    project_id: str
    user_id: str
    lease_id: str | None = Field(description="for updates, queue and hold outcomes")
    lease_name: str
    step: Literal["create", "update", "series", "queue", "hold"]
    outcome: Literal["refused", "timed_out", "gave_up", "abandoned"]
    reason: str = Field(
        description="too_few_match, too_few_free, shared, fits, unexplained, usage_rule, "
        "deadline, attempts or hold_expired"
    )
    message: str
    resource_type: str
    min: int
    max: int
    properties: str
    start_date: str
    end_date: str
    offer: CounterOfferShown | None = Field(description="the best counter-offer made")
    offer_taken: bool | None = Field(description="None: no offer was made (docs/demand.md)")


class DemandPlan(BaseModel):
    resource_type: Literal["physical:host"]
    properties: str
    template_host: str = Field(description="the host the synthetic hosts copy")
    target_percent: int
    measure: Literal["requests"] = Field(description="the share is counted in requests")
    replayed_requests: int = Field(description="refused host requests replayed")
    counted_requests: int = Field(description="of those, the ones the template matches")
    needed_requests: int
    extra_hosts: int | None = Field(
        description="the fewest extra hosts that admit needed_requests; None: more than 1000"
    )
    admitted_requests: int
    admitted_without_extra: int


class Demand(BaseModel):
    start: str = Field(description="ISO 8601, UTC, included")
    end: str = Field(description="ISO 8601, UTC, excluded")
    period: Literal["day", "month", "custom"]
    bucket: Literal["hour", "day"]
    groups: list[DemandGroup]
    refusals: list[RefusalRecord]
    plan: DemandPlan | None


class DemandResponse(BaseModel):
    demand: Demand
