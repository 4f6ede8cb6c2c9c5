"""Who is asking: the identity every service call is made on behalf of. What it may do is the
policy's business (``climate.policy``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Actor:
    user_id: str
    project_id: str
    roles: frozenset[str]
    token: str | None = field(default=None, repr=False, compare=False)
    """The Keystone token the request came with (``auth = "keystone"``), for a trust to be
    made from it (docs/openstack.md); never stored or logged."""

    def owner(self) -> dict[str, str]:
        """The policy target of something this actor owns: their project and user."""
        return {"project_id": self.project_id, "user_id": self.user_id}
