"""Notifications: written to the outbox with the change, delivered later with retries."""

from __future__ import annotations

import datetime as dt

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
