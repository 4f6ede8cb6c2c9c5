"""The body of ``GET /v1/usage``: hours and amounts as decimal strings (exact, never floats)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

DecimalText = str


class UsageLine(BaseModel):
    resource_type: str = Field(
        description="physical:host, virtual:instance:vcpu, virtual:instance:memory_gb, "
        "virtual:volume, virtual:floatingip, device or network"
    )
    unit: str = Field(description="what the hours count, e.g. host-hours, gb-hours")
    price_rule: str = Field(description="the price table's rule that applied; empty: free")
    price: DecimalText = Field(description="per unit-hour")
    reserved_hours: DecimalText = Field(description="unit-hours reserved in the period")
    used_hours: DecimalText = Field(
        description="unit-hours between the leases' real starts and ends"
    )
    reserved_amount: DecimalText
    used_amount: DecimalText


class ProjectUsage(BaseModel):
    project_id: str
    reserved_amount: DecimalText
    used_amount: DecimalText
    lines: list[UsageLine]


class Usage(BaseModel):
    start: str = Field(description="ISO 8601, UTC, included")
    end: str = Field(description="ISO 8601, UTC, excluded")
    period: Literal["day", "month", "custom"]
    projects: list[ProjectUsage]


class UsageResponse(BaseModel):
    usage: Usage
