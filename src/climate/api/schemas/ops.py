"""Bodies of the operator's endpoints: ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from climate.api.schemas.shapes import Record


class Health(BaseModel):
    status: Literal["ok"] = Field(description="The process is up and answers HTTP")


class ReadinessCheck(BaseModel):
    name: Literal["database", "manager", "outbox"]
    ok: bool
    detail: str = Field(description="What was found, e.g. 'last heartbeat 0.4 s ago'")


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    failed: list[str] = Field(description="The names of the checks that failed (503 if any)")
    checks: list[ReadinessCheck]


class VersionLink(Record):
    href: str
    rel: Literal["self"]


class Version(Record):
    id: Literal["v1.0"]
    status: Literal["CURRENT"]
    links: list[VersionLink]
    min_version: str
    max_version: str


class Versions(Record):
    """Blazar's version document (300 Multiple Choices, as Blazar answers)."""

    versions: list[Version]
