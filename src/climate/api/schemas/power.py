"""The power policy's report (``GET /v1/power``, docs/power.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from climate import wire
from climate.services.power import PowerReport


class PowerHostPublic(BaseModel):
    id: str
    name: str
    state: Literal["on", "off", "down"] = Field(
        description="off: powered down by the policy; down: failed, left alone"
    )
    off_since: str | None
    next_lease_start: str | None = Field(
        description="when its next allocation starts, if within power_idle_hours"
    )
    idle: bool = Field(description="on with nothing allocated within power_idle_hours")
    hours_off: float = Field(description="hours powered down within the period")


class PowerPublic(BaseModel):
    policy: Literal["off", "report", "act"]
    idle_hours: float
    wake_lead_seconds: float
    host_watts: float
    start: str
    end: str
    saved_host_hours: float
    saved_kwh: float
    hosts: list[PowerHostPublic]


class PowerAnswer(BaseModel):
    power: PowerPublic


def power_answer(report: PowerReport) -> PowerAnswer:
    return PowerAnswer(
        power=PowerPublic(
            policy=report.policy,  # type: ignore[arg-type]
            idle_hours=report.idle_hours,
            wake_lead_seconds=report.wake_lead_seconds,
            host_watts=report.host_watts,
            start=wire.lease_date(report.start),
            end=wire.lease_date(report.end),
            saved_host_hours=round(report.saved_host_hours, 6),
            saved_kwh=round(report.saved_kwh, 6),
            hosts=[
                PowerHostPublic(
                    id=str(h.id),
                    name=h.name,
                    state=h.state,  # type: ignore[arg-type]
                    off_since=wire.stamp(h.off_since),
                    next_lease_start=wire.stamp(h.next_lease_start),
                    idle=h.idle,
                    hours_off=round(report.hours_off.get(h.id, 0.0), 6),
                )
                for h in report.hosts
            ],
        )
    )
