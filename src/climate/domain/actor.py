"""Who is asking: the identity every service call is made on behalf of. What it may do is the
policy's business (``climate.policy``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    user_id: str
    project_id: str
    roles: frozenset[str]
