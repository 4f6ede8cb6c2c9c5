"""The transactional outbox: notifications written with the change that caused them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from climate.db.tables import OutboxMessage
from climate.db.types import as_utc

PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"


def enqueue(
    session: Session,
    urls: Sequence[str],
    topic: str,
    payload: dict[str, Any],
    now: dt.datetime,
    lease_id: str | None = None,
) -> None:
    session.add_all(
        OutboxMessage(
            topic=topic,
            lease_id=lease_id,
            payload=payload,
            url=url,
            status=PENDING,
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
        for url in urls
    )


def due(session: Session, now: dt.datetime, limit: int) -> Sequence[OutboxMessage]:
    query = (
        select(OutboxMessage)
        .where(OutboxMessage.status == PENDING, OutboxMessage.next_attempt_at <= now)
        .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return session.scalars(query).all()


def next_due(session: Session) -> dt.datetime | None:
    value = session.scalar(
        select(func.min(OutboxMessage.next_attempt_at)).where(OutboxMessage.status == PENDING)
    )
    return None if value is None else as_utc(value)


def by_status(session: Session, status: str) -> Sequence[OutboxMessage]:
    return session.scalars(
        select(OutboxMessage).where(OutboxMessage.status == status).order_by(OutboxMessage.id)
    ).all()
