"""API tokens: issued once in clear, stored as a hash, checked in constant time.

Tokens are managed only by ``climate token`` on a machine that reaches the database (there is no
HTTP API for them, so no policy rule): the audit log names that command line as the actor."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from climate import inputs
from climate.context import ServiceContext
from climate.db import audit
from climate.db import tokens as token_rows
from climate.db.tables import NAME_LENGTH, ApiToken
from climate.domain.actor import Actor
from climate.errors import InvalidInput, NotFound

PREFIX = "clm"
CLI = "cli"
"""The audit log's actor for token changes: the ``climate token`` command line."""


@dataclass(frozen=True)
class IssuedToken:
    token: str
    """The secret, shown once."""
    row: ApiToken


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def issue(
        self,
        name: str,
        user_id: str,
        project_id: str,
        roles: Sequence[str],
        expires_in: dt.timedelta | None = None,
    ) -> IssuedToken:
        if not name or len(name) > NAME_LENGTH:
            raise InvalidInput("name", f"1 to {NAME_LENGTH} characters")
        for field, value in (("user", user_id), ("project", project_id)):
            if not value:
                raise InvalidInput(field, "required")
        for field, value in (("name", name), ("user", user_id), ("project", project_id)):
            inputs.name_text(field, value)
        for role in roles:
            inputs.name_text("roles", role)
        now = self.ctx.clock.now()
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        row = ApiToken(
            id=token_id,
            name=name,
            secret_hash=_digest(secret),
            user_id=user_id,
            project_id=project_id,
            roles=",".join(sorted({r.strip() for r in roles if r.strip()})),
            created_at=now,
            expires_at=None if expires_in is None else now + expires_in,
        )
        with self.ctx.db.transaction() as session:
            token_rows.add(session, row)
            _audit(session, now, "token.issue", row, {"name": name, "roles": row.roles})
        return IssuedToken(f"{PREFIX}_{token_id}_{secret}", row)

    def authenticate(self, presented: str) -> Actor | None:
        """The actor a token stands for, or None if it is unknown, wrong, expired or revoked."""
        prefix, _, rest = presented.partition("_")
        token_id, _, secret = rest.partition("_")
        if prefix != PREFIX or not token_id or not secret:
            return None
        with self.ctx.db.reader() as session:
            row = token_rows.get(session, token_id)
        # Compare against a dummy hash when the id is unknown, so timing says nothing either way.
        expected = row.secret_hash if row is not None else _digest("")
        if not hmac.compare_digest(expected, _digest(secret)) or row is None:
            return None
        now = self.ctx.clock.now()
        if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
            return None
        roles = frozenset(r for r in row.roles.split(",") if r)
        return Actor(row.user_id, row.project_id, roles)

    def list_all(self) -> Sequence[ApiToken]:
        with self.ctx.db.reader() as session:
            return token_rows.list_all(session)

    def revoke(self, token_id: str) -> None:
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            row = token_rows.get(session, token_id)
            if row is None:
                raise NotFound("Token", token_id)
            row.revoked_at = now
            _audit(session, now, "token.revoke", row, {"name": row.name})


def _audit(
    session: Session, now: dt.datetime, action: str, row: ApiToken, detail: dict[str, object]
) -> None:
    """Who the token stands for and its name, never its secret or hash."""
    audit.record(
        session,
        at=now,
        actor=CLI,
        action=action,
        target_type="token",
        target_id=row.id,
        detail={"user_id": row.user_id, "project_id": row.project_id, **detail},
    )
