"""Who is asking: the identity every service call is made on behalf of."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    user_id: str
    project_id: str
    roles: frozenset[str]
    admin_role: str = "admin"

    @property
    def is_admin(self) -> bool:
        return self.admin_role in self.roles

    def scope(self) -> str | None:
        """The project the actor is confined to, or None for an admin who sees every project."""
        return None if self.is_admin else self.project_id
