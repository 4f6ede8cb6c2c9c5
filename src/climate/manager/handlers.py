"""What each event does to its lease, in the event's own transaction."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from climate.backends.base import Backend, Handover
from climate.db.tables import Event, Lease, Reservation
from climate.domain.status import (
    LEASE_TRANSITIONS,
    EventType,
    LeaseStatus,
    ReservationStatus,
    check_lease_transition,
    check_reservation_transition,
)
from climate.notify import enqueue_lease
from climate.services.context import ServiceContext

# The lease status an event puts the lease in while its backend work runs.
TRANSITIONAL = {
    EventType.START_LEASE: LeaseStatus.STARTING,
    EventType.END_LEASE: LeaseStatus.TERMINATING,
}


def mark_in_progress(lease: Lease, event: Event) -> None:
    """Move the lease to its transitional status when its start or end event is claimed."""
    target = TRANSITIONAL.get(EventType(event.event_type))
    if target is None or target not in LEASE_TRANSITIONS[LeaseStatus(lease.status)]:
        return  # already there, or nothing left to do: the handler sees that and does nothing
    lease.status = target


class EventHandlers:
    def __init__(self, ctx: ServiceContext, backend: Backend) -> None:
        self.ctx = ctx
        self.backend = backend

    def run(self, session: Session, lease: Lease, event: Event, now: dt.datetime) -> None:
        kind = EventType(event.event_type)
        if kind is EventType.START_LEASE:
            self._start(session, lease, now)
        elif kind is EventType.END_LEASE:
            self._end(session, lease, now)
        else:
            self._before_end(session, lease, now)

    def _start(self, session: Session, lease: Lease, now: dt.datetime) -> None:
        if lease.status != LeaseStatus.STARTING:
            return  # deleted or ended before it could start: nothing to hand out
        for reservation in _live(lease):
            self.backend.start(session, self._handover(lease, reservation, now))
            check_reservation_transition(reservation.status, ReservationStatus.ACTIVE)
            reservation.status = ReservationStatus.ACTIVE
            reservation.updated_at = now
        check_lease_transition(lease.status, LeaseStatus.ACTIVE)
        lease.status = LeaseStatus.ACTIVE
        self._notify(session, "lease.start", lease, now)

    def _end(self, session: Session, lease: Lease, now: dt.datetime) -> None:
        if lease.status != LeaseStatus.TERMINATING:
            return
        for reservation in lease.reservations:
            if reservation.status == ReservationStatus.DELETED:
                continue
            self.backend.end(session, self._handover(lease, reservation, now))
            self.ctx.resource_types[reservation.resource_type].release(session, reservation, now)
            check_reservation_transition(reservation.status, ReservationStatus.DELETED)
            reservation.status = ReservationStatus.DELETED
            reservation.updated_at = now
        check_lease_transition(lease.status, LeaseStatus.TERMINATED)
        lease.status = LeaseStatus.TERMINATED
        self._notify(session, "lease.end", lease, now)

    def _before_end(self, session: Session, lease: Lease, now: dt.datetime) -> None:
        if lease.status != LeaseStatus.ACTIVE or lease.deleted_at is not None:
            return
        for reservation in _live(lease):
            action = str(reservation.params.get("before_end", "default"))
            self.backend.before_end(session, self._handover(lease, reservation, now), action)
        self._notify(session, "lease.before_end", lease, now)

    def fail(self, session: Session, lease: Lease, reason: str, now: dt.datetime) -> None:
        """The event gave up: the lease and its live reservations go to ERROR with the reason."""
        if lease.status != LeaseStatus.ERROR:
            check_lease_transition(lease.status, LeaseStatus.ERROR)
            lease.status = LeaseStatus.ERROR
        lease.status_reason = reason
        for reservation in _live(lease):
            check_reservation_transition(reservation.status, ReservationStatus.ERROR)
            reservation.status = ReservationStatus.ERROR
        self._notify(session, "lease.error", lease, now)

    def _handover(self, lease: Lease, reservation: Reservation, now: dt.datetime) -> Handover:
        resource_type = self.ctx.resource_types[reservation.resource_type]
        return Handover(
            lease_id=lease.id,
            reservation_id=reservation.id,
            project_id=lease.project_id,
            resource_type=reservation.resource_type,
            resource_ids=tuple(resource_type.resource_ids(reservation)),
            at=now,
        )

    def _notify(self, session: Session, topic: str, lease: Lease, now: dt.datetime) -> None:
        lease.updated_at = now
        enqueue_lease(session, self.ctx.settings.webhooks, topic, lease, now)


def _live(lease: Lease) -> list[Reservation]:
    return [
        r
        for r in lease.reservations
        if r.status in (ReservationStatus.PENDING, ReservationStatus.ACTIVE)
    ]
