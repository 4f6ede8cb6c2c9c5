"""Who is calling: noauth (identity headers, or the configured default admin) or API tokens."""

from __future__ import annotations

from fastapi import Request

from climate.config import Settings
from climate.domain.actor import Actor
from climate.errors import NotAuthorized
from climate.services.tokens import TokenService


class Authenticator:
    def __init__(self, settings: Settings, tokens: TokenService) -> None:
        self.settings = settings
        self.tokens = tokens

    @property
    def reads_database(self) -> bool:
        """Token lookups query the database; noauth only reads headers."""
        return self.settings.auth == "token"

    def __call__(self, request: Request) -> Actor:
        headers = request.headers
        if self.settings.auth == "token":
            presented = headers.get("x-auth-token")
            if not presented:
                raise NotAuthorized("an X-Auth-Token header is required")
            actor = self.tokens.authenticate(presented)
            if actor is None:
                raise NotAuthorized("the token is unknown, expired or revoked")
            return actor
        project, user, roles = (
            headers.get("x-project-id"),
            headers.get("x-user-id"),
            headers.get("x-roles"),
        )
        if project is None and user is None and roles is None:
            return Actor(
                self.settings.default_user_id,
                self.settings.default_project_id,
                frozenset({self.settings.admin_role}),
            )
        if not project:
            # Half an identity must not borrow the default project (and see its leases).
            raise NotAuthorized("X-Project-Id is required when identity headers are sent")
        return Actor(
            user or self.settings.default_user_id,
            project,
            frozenset(r.strip() for r in (roles or "").split(",") if r.strip()),
        )
