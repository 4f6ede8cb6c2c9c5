"""Notifications: written to the outbox with the change, delivered later with retries.

One row per sink: each webhook URL gets the lease as the API shows it, each bus topic
(``bus:<topic>``) the oslo.messaging message Blazar would send."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from climate import wire
from climate.addresses import BUS_PREFIX
from climate.db import outbox
from climate.db.tables import Lease
from climate.domain.status import EventStatus, EventType, LeaseStatus
from climate.fairshare import external
from climate.notify import bus

if TYPE_CHECKING:
    from climate.config import Settings


def enqueue_lease(
    session: Session,
    settings: Settings,
    topic: str,
    lease: Lease,
    now: dt.datetime,
    event_type: str | None = None,
) -> None:
    """Queue ``topic`` (lease.create, lease.start, ...) to every sink: the lease as the API
    shows it to webhooks, Blazar's notification of ``event_type`` (by default the one ``topic``
    maps to) to the bus."""
    if not settings.notification_sinks:
        return
    session.flush()
    enqueue_leases(session, settings, [(topic, lease, event_type)], now)


def enqueue_host(
    settings: Settings, session: Session, topic: str, payload: dict[str, object], now: dt.datetime
) -> None:
    """Queue a host's ``topic`` (host.power_off, ...) to every webhook (the bus carries only
    Blazar's lease notifications)."""
    if settings.webhooks:
        body = {"event": topic, "sent_at": wire.stamp(now), "host": payload}
        outbox.enqueue(session, settings.webhooks, topic, body, now)


NEVER_STARTED = frozenset({LeaseStatus.PENDING, LeaseStatus.HELD, LeaseStatus.IN_PROGRESS})


def ended(topic: str, lease: Lease) -> bool:
    """Whether the external service is told of this lease's end now (Blazar's ``on_end``):
    at its end, or when it is deleted before it started (no end will come then)."""
    return topic == "lease.end" or (topic == "lease.delete" and not _started(lease))


def _started(lease: Lease) -> bool:
    if lease.status not in NEVER_STARTED | {LeaseStatus.DELETING}:
        return True
    # A deleted lease is DELETING whether or not it had started: its start event tells.
    return any(
        e.event_type == EventType.START_LEASE and e.status == EventStatus.DONE for e in lease.events
    )


def enqueue_leases(
    session: Session,
    settings: Settings,
    notices: Sequence[tuple[str, Lease, str | None]],
    now: dt.datetime,
) -> None:
    """``enqueue_lease`` for many (topic, lease, event type) at once, for leases that are fully
    loaded and whose changes are already written (the manager's batches): no flush per lease."""
    sinks = settings.notification_sinks
    if not sinks or not notices:
        return
    on_end = external.endpoint(settings, "on-end")
    webhooks = [s for s in sinks if not s.startswith(BUS_PREFIX) and s != on_end]
    topics = [s for s in sinks if s.startswith(BUS_PREFIX)]
    sent_at = wire.stamp(now)
    for topic, lease, event_type in notices:
        if on_end and ended(topic, lease):
            body = {
                "context": external.context(settings, lease.project_id, lease.user_id),
                "lease": wire.lease(lease),
            }
            outbox.enqueue(session, [on_end], "on-end", body, now, lease.id)
        if webhooks:
            payload = {"event": topic, "sent_at": sent_at, "lease": wire.lease(lease)}
            outbox.enqueue(session, webhooks, topic, payload, now, lease.id)
        if topics and not (topic == "lease.end" and lease.deleted_at is not None):
            # Blazar ends a deleted running lease inside delete_lease: its lease.delete is
            # the last notification of the lease, no end_lease follows.
            kind = event_type or bus.EVENT_TYPES[topic]
            stored = bus.message(kind, lease, settings.notification_publisher_id, now)
            outbox.enqueue(session, topics, kind, stored, now, lease.id)
