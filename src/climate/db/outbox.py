"""The transactional outbox: notifications written with the change that caused them.

Each row is one message for one sink, named by its ``url``. A pending row is due once
``next_attempt_at`` has passed; a deliverer claims rows by pushing ``next_attempt_at`` past the
time their sending can take, and that exact time is its claim: it records an outcome only on
rows that still carry it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from climate.db.engine import AFTER_COMMIT, OUTBOX_LISTENERS
from climate.db.tables import OutboxMessage
from climate.db.types import as_utc

PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"
_WAKES = "outbox_wakes"
"""``session.info`` key: this transaction tells the outbox's listeners when it commits."""


def _tell(listeners: list[Callable[[], None]]) -> None:
    for wake in list(listeners):
        wake()


def enqueue(
    session: Session,
    urls: Sequence[str],
    topic: str,
    payload: dict[str, Any],
    now: dt.datetime,
    lease_id: str | None = None,
) -> None:
    listeners: list[Callable[[], None]] | None = session.info.get(OUTBOX_LISTENERS)
    if listeners is not None and not session.info.get(_WAKES):
        session.info[_WAKES] = True
        session.info.setdefault(AFTER_COMMIT, []).append(lambda: _tell(listeners))
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


def due_sinks(session: Session, now: dt.datetime) -> Sequence[str]:
    """The sinks with messages due, the longest waiting first."""
    query = (
        select(OutboxMessage.url)
        .where(OutboxMessage.status == PENDING, OutboxMessage.next_attempt_at <= now)
        .group_by(OutboxMessage.url)
        .order_by(func.min(OutboxMessage.next_attempt_at))
    )
    return session.scalars(query).all()


def unflushed(session: Session) -> None:
    """PostgreSQL: this transaction's commit returns without waiting for its WAL to reach the
    disk. For a deliverer's own bookkeeping (claims, outcomes, releases): one that a crash
    loses leaves its message due again, a repeat that at-least-once delivery allows, and a
    send no longer waits behind a disk flush (under I/O load, longer than a second). SQLite
    commits in WAL mode do not wait for the disk anyway."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL synchronous_commit TO OFF"))


def due(session: Session, url: str, now: dt.datetime, limit: int) -> Sequence[OutboxMessage]:
    """Up to ``limit`` of ``url``'s due messages in the order they were due, locked against other
    deliverers (PostgreSQL; SQLite writers are serialised anyway)."""
    query = (
        select(OutboxMessage)
        .where(
            OutboxMessage.status == PENDING,
            OutboxMessage.url == url,
            OutboxMessage.next_attempt_at <= now,
        )
        .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return session.scalars(query).all()


def release(session: Session, ids: Collection[int], claim: dt.datetime, now: dt.datetime) -> None:
    """Make claimed messages that were not sent due again at once, where ``claim`` still holds."""
    session.execute(
        update(OutboxMessage)
        .where(
            OutboxMessage.id.in_(ids),
            OutboxMessage.status == PENDING,
            OutboxMessage.next_attempt_at == claim,
        )
        .values(next_attempt_at=now)
    )


def next_due(session: Session, excluding: Collection[str] = ()) -> dt.datetime | None:
    """When the next message is due, leaving out the sinks in ``excluding``."""
    query = select(func.min(OutboxMessage.next_attempt_at)).where(OutboxMessage.status == PENDING)
    if excluding:
        query = query.where(OutboxMessage.url.not_in(excluding))
    value = session.scalar(query)
    return None if value is None else as_utc(value)


def by_status(session: Session, status: str) -> Sequence[OutboxMessage]:
    return session.scalars(
        select(OutboxMessage).where(OutboxMessage.status == status).order_by(OutboxMessage.id)
    ).all()
