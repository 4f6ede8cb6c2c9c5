"""Bodies of the dashboard's data endpoint (``GET /v1/timeline``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TimelineResource(BaseModel):
    """One row of the timeline: a host, an item or a volume pool."""

    id: str
    name: str = Field(
        description="the resource's name; a host's is 'host <id>' for a caller who may not "
        "list hosts (as in availability windows)"
    )
    reservable: bool = Field(description="false for a host that is down or not reservable")
    pool: str = Field(description="an item's pool, '' when it has none")


class TimelineLease(BaseModel):
    """A lease the caller may read (its own project's; every project's for an admin)."""

    id: str
    name: str
    project_id: str
    status: str


class TimelineBar(BaseModel):
    """One allocation: ``resource`` is taken over [start, end)."""

    resource: int = Field(ge=0, description="index into resources")
    start: int = Field(description="seconds since the epoch (UTC)")
    end: int = Field(description="seconds since the epoch (UTC)")
    amount: int = Field(ge=0, description="instances on a host, GB of a pool; 0: whole")
    lease: int | None = Field(
        ge=0,
        description="index into leases; null for a booking the caller may not read (shown "
        "as anonymous busy time: no name, project, id or status)",
    )


class Timeline(BaseModel):
    resource_type: str
    start: int = Field(description="seconds since the epoch (UTC)")
    end: int = Field(description="seconds since the epoch (UTC)")
    now: int = Field(description="the server's clock, seconds since the epoch (UTC)")
    resources: list[TimelineResource]
    leases: list[TimelineLease]
    bars: list[TimelineBar]


class TimelineAnswer(BaseModel):
    timeline: Timeline
