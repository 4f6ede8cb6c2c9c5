"""Notifications: written to the outbox with the change, delivered later with retries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy.orm import Session

from climate import wire
from climate.db import outbox
from climate.db.tables import Lease


def enqueue_lease(
    session: Session, urls: tuple[str, ...], topic: str, lease: Lease, now: dt.datetime
) -> None:
    """Queue ``topic`` (lease.create, lease.start, ...) with the lease as the API shows it."""
    if not urls:
        return
    session.flush()
    payload = {"event": topic, "sent_at": wire.stamp(now), "lease": wire.lease(lease)}
    outbox.enqueue(session, urls, topic, payload, now, lease.id)


def enqueue_leases(
    session: Session,
    urls: tuple[str, ...],
    notices: Sequence[tuple[str, Lease]],
    now: dt.datetime,
) -> None:
    """``enqueue_lease`` for many (topic, lease) pairs at once, for leases that are fully loaded
    and whose changes are already written (the manager's batches): no flush per lease."""
    if not urls or not notices:
        return
    sent_at = wire.stamp(now)
    for topic, lease in notices:
        payload = {"event": topic, "sent_at": sent_at, "lease": wire.lease(lease)}
        outbox.enqueue(session, urls, topic, payload, now, lease.id)
