"""What the audit log and the availability routes answer (rendered by their routes)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from climate.api.schemas.refusals import Omitted
from climate.api.schemas.shapes import Count, LeaseDate, NumericId, Positive, Record


class AuditRecord(Record):
    id: int
    at: LeaseDate
    actor_user: str | None
    actor_project: str | None
    action: str
    target_type: str
    target_id: str
    detail: Any = Field(description="what changed, as JSON (null when nothing more to say)")


class AuditLog(Record):
    audit_log: list[AuditRecord]


class UsageDecision(Record):
    """One usage rule's decision on a lease (docs/fair-share.md)"""

    rule: str
    kind: str
    limit: float
    figure: float
    unit: str
    allowed: bool
    exempt: bool
    message: str


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: NumericId
    count: Positive
    host_name: str | Omitted = None


class OfferedItem(BaseModel):
    """An item by id and name (its name field: name, segment_id or floating_ip_address)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"additionalProperties": {"type": "string"}}
    )

    id: NumericId


class Offered(BaseModel):
    """What one reservation would get, in request order: whole hosts, instances per host, items
    or GB from a pool."""

    model_config = ConfigDict(extra="forbid")

    resource_type: str
    min: Positive | Omitted = None
    max: Positive | Omitted = None
    amount: Positive | Omitted = None
    available: Count = Field(
        description="free for the whole window, in the reservation's units: matching hosts or "
        "items, instances of its size, the most GB in one matching pool"
    )
    hosts: list[NumericId] | Omitted = Field(
        None, description="physical:host: the host ids admission would grant"
    )
    host_names: list[str] | Omitted = Field(None, description="only to callers that may list hosts")
    placement: list[Placement] | Omitted = Field(
        None, description="virtual:instance: instances per host"
    )
    items: list[OfferedItem] | Omitted = Field(
        None, description="devices, network segments, floating IPs: id and name"
    )
    size_gb: Positive | Omitted = None
    pool: str | Omitted = None
    pool_id: NumericId | Omitted = None
    gb: Positive | Omitted = None


class AvailabilityWindow(Record):
    start_date: LeaseDate
    end_date: LeaseDate
    reservations: list[Offered]
    usage_rules: list[UsageDecision] = Field(
        description="the usage rules a lease taking this window would break "
        "(docs/fair-share.md); empty when none"
    )


class Windows(Record):
    windows: list[AvailabilityWindow]


class Bucket(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_date: LeaseDate
    free: Count
    busy: Count | Omitted = None
    partly_busy: Count | Omitted = None
    largest: Count | Omitted = Field(
        None, description="volumes and instances: the most free in one pool or on one host"
    )


class CapacityTimeline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resource_type: str
    unit: str = Field(
        description="what the counts count: hosts, devices, network segments, floating IPs, "
        "GB, instances (of the size asked)"
    )
    start_date: LeaseDate
    end_date: LeaseDate
    bucket: Positive = Field(description="seconds")
    total: Count = Field(
        description="matching hosts or items; GB of the matching pools; instances the matching "
        "hosts hold when empty"
    )
    hosts: Count | Omitted = Field(None, description="physical:host only: hosts matching")
    buckets: list[Bucket]


class CapacityTimelineAnswer(Record):
    timeline: CapacityTimeline
