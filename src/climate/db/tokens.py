"""API tokens: only a hash of each secret is stored."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from climate.db.tables import ApiToken


def add(session: Session, token: ApiToken) -> None:
    session.add(token)
    session.flush()


def get(session: Session, token_id: str) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_all(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.created_at)).all()
