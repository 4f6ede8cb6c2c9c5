"""Bodies of /v1/policy: the usage rules a project is held to and what it consumes."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RuleUsage(BaseModel):
    """One usage rule as it applies to the project (and user) asked about."""

    rule: str = Field(description="The rule's name in the configuration.")
    kind: str = Field(
        description="max_length, max_advance, extension_window, max_extension, concurrent, "
        "budget or stacking."
    )
    description: str = Field(description="What the rule allows, in words.")
    limit: float = Field(description="In ``unit``.")
    unit: str = Field(description="seconds, hosts, vcpus, gpus, ips, gb, <unit>-days or leases.")
    per: str = Field(description="Whose consumption counts: user or project.")
    resource_type: str | None = Field(description="The resource type in scope; null: every type.")
    properties: str = Field(description="The resource properties in scope (a query); '': all.")
    exempt: bool = Field(description="The project is exempt from the rule.")
    current: float | None = Field(
        description="concurrent: held now; budget: used in the window ending now; null for "
        "the rules of a lease's own window."
    )
    ahead: float | None = Field(
        description="concurrent: the most held at once over the next 30 days; budget: booked "
        "in the window starting now; null otherwise."
    )


class PolicyUsage(BaseModel):
    """``GET /v1/policy/usage``."""

    project_id: str
    user_id: str = Field(description="Whose figures the per-user rules show.")
    rules: list[RuleUsage]
    external_service: bool = Field(
        description="An external admission service is asked about each lease too."
    )


class Caller(BaseModel):
    """Who is calling, as the policy sees them."""

    user_id: str
    project_id: str
    roles: list[str] = Field(description="As the token (or identity headers) gives them.")
    admin: bool = Field(
        description="The ``admin`` rule holds: every project's leases and allocations are visible."
    )
    allowed: list[str] = Field(
        description="The policy rules that hold for the caller on their own project's "
        "things (``blazar:oshosts:get``: may list hosts; ``climate:audit:get``: may read the "
        "audit log...)."
    )


class CallerAnswer(BaseModel):
    """``GET /v1/policy/caller``."""

    caller: Caller | None = Field(
        description="null: a token is needed (``auth`` token or keystone) and none was sent."
    )
