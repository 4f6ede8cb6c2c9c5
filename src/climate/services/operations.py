"""Operator recovery: retry a lease's failed events, or end a lease now (with or without the
backend). One transaction per call, serialised with admissions by the admission lock (which
also makes a manager's plan for these events stale)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from climate.context import ServiceContext
from climate.db import audit
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Event, Lease
from climate.domain.actor import Actor
from climate.domain.status import (
    EventStatus,
    EventType,
    LeaseStatus,
    ReservationStatus,
    check_event_transition,
    check_lease_transition,
    check_reservation_transition,
)
from climate.errors import Conflict, NotFound
from climate.fairshare import credits
from climate.notify import enqueue_lease


class OperatorService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def retry(self, actor: Actor, lease_id: str) -> Lease:
        """Put the lease's failed events back to waiting, due now with their attempts reset, and
        the lease (and its failed reservations) back where its events say it is: ACTIVE once its
        start is done, else PENDING. An operator's retry is the one way out of ERROR other than
        the lease's end, so it moves statuses the manager's transition tables never would.

        :raises Conflict: the lease has ended, has no failed event, or one of its events is
            running right now.
        """
        self.ctx.policy.enforce(actor, "climate:leases:retry", {})
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            lease = self.lock(session, lease_id, now)
            if lease.status == LeaseStatus.TERMINATED:
                raise Conflict(f"lease {lease.id} has ended: there is nothing to retry")
            failed = [e for e in lease.events if e.status == EventStatus.ERROR]
            if not failed:
                raise Conflict(
                    f"lease {lease.id} is {lease.status} and has no failed event: "
                    "there is nothing to retry"
                )
            for event in failed:
                check_event_transition(event.status, EventStatus.UNDONE)
                event.status = EventStatus.UNDONE
                event.attempts = 0
                event.not_before = now
                event.updated_at = now
            if lease.status == LeaseStatus.ERROR:
                started = any(
                    e.event_type == EventType.START_LEASE and e.status == EventStatus.DONE
                    for e in lease.events
                )
                lease.status = LeaseStatus.ACTIVE if started else LeaseStatus.PENDING
                lease.status_reason = None
                restored = ReservationStatus.ACTIVE if started else ReservationStatus.PENDING
                for reservation in lease.reservations:
                    if reservation.status == ReservationStatus.ERROR:
                        reservation.status = restored
                        reservation.updated_at = now
            audit.record(
                session,
                at=now,
                actor=actor,
                action="lease.retry",
                target_type="lease",
                target_id=lease.id,
                detail={"project_id": lease.project_id, "events": [e.id for e in failed]},
            )
            return self.done(session, lease, now, "lease.update")

    def force_end(self, actor: Actor, lease_id: str, *, skip_backend: bool = False) -> Lease:
        """End the lease now.

        By default its end event is made due now (its waiting start and warning are dropped,
        a failed end waits again with its attempts reset) and the manager runs it at once,
        through the backend. With ``skip_backend`` the lease is TERMINATED in this transaction,
        its allocations are cut at now and its unfinished events are marked ERROR: for a lease
        whose backend keeps failing. A lease that has not started yet is terminated at once
        either way: there is nothing to take back.

        :raises Conflict: the lease has ended, or one of its events is running right now.
        """
        self.ctx.policy.enforce(actor, "climate:leases:force_end", {})
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            lease = self.lock(session, lease_id, now)
            if lease.status == LeaseStatus.TERMINATED:
                raise Conflict(f"lease {lease.id} has ended already")
            forced = f"ended by {actor.user_id} (project {actor.project_id}) at {now.isoformat()}"
            audit.record(
                session,
                at=now,
                actor=actor,
                action="lease.force_end",
                target_type="lease",
                target_id=lease.id,
                detail={
                    "project_id": lease.project_id,
                    "status": lease.status,
                    "skip_backend": skip_backend,
                },
            )
            if skip_backend or lease.status == LeaseStatus.PENDING:
                if lease.status != LeaseStatus.PENDING:
                    forced += " without the backend"
                self._terminate(session, lease, forced, now)
                return self.done(session, lease, now, "lease.end")
            self.end_now(session, lease, f"end forced: {forced}", now)
            return self.done(session, lease, now, "lease.update")

    def end_now(self, session: Session, lease: Lease, reason: str, now: dt.datetime) -> None:
        """A started lease's end made due now, in the caller's transaction (which holds the
        admission lock and has ``lock``ed the lease): its waiting warnings are dropped, a failed
        end waits again with its attempts reset, the manager runs it at once through the
        backend (the end policy applies) and its allocations are cut at ``now``."""
        for event in list(lease.events):
            if event.status not in (EventStatus.UNDONE, EventStatus.ERROR):
                continue
            if event.event_type != EventType.END_LEASE:
                if event.status == EventStatus.UNDONE:
                    session.delete(event)
                continue
            if event.status == EventStatus.ERROR:
                check_event_transition(event.status, EventStatus.UNDONE)
                event.status = EventStatus.UNDONE
                event.attempts = 0
            event.time = event.not_before = now
            event.updated_at = now
        self._cut(session, lease, now)
        lease.status_reason = reason

    # -- helpers -----------------------------------------------------------------------------

    def lock(self, session: Session, lease_id: str, now: dt.datetime) -> Lease:
        """The lease, locked; refused while a manager runs one of its events (the manager writes
        its outcome without looking again)."""
        lease = lease_rows.lock_lease(session, lease_id)
        if lease is None:
            raise NotFound("Lease", lease_id, "lease_id")
        for event in lease.events:
            if _running(event, now):
                raise Conflict(
                    f"lease {lease.id}: its {event.event_type} event is running on manager "
                    f"{event.claimed_by}; try again once it has finished"
                )
        return lease

    def _terminate(self, session: Session, lease: Lease, forced: str, now: dt.datetime) -> None:
        status = LeaseStatus(lease.status)
        if status in (LeaseStatus.STARTING, LeaseStatus.ACTIVE):
            check_lease_transition(status, LeaseStatus.TERMINATING)
            status = LeaseStatus.TERMINATING
        check_lease_transition(status, LeaseStatus.TERMINATED)
        lease.status = LeaseStatus.TERMINATED
        lease.status_reason = forced
        for event in lease.events:
            if event.status in (EventStatus.UNDONE, EventStatus.IN_PROGRESS, EventStatus.ERROR):
                event.status = EventStatus.ERROR
                event.last_error = f"not run: lease {forced}"
                event.claimed_by = event.claimed_until = None
                event.updated_at = now
        self._cut(session, lease, now)
        for reservation in lease.reservations:
            if reservation.status != ReservationStatus.DELETED:
                check_reservation_transition(reservation.status, ReservationStatus.DELETED)
                reservation.status = ReservationStatus.DELETED
                reservation.updated_at = now

    def _cut(self, session: Session, lease: Lease, now: dt.datetime) -> None:
        """Allocations end at ``now``: the hosts are free for others from then on."""
        for reservation in lease.reservations:
            self.ctx.resource_types[reservation.resource_type].release(session, reservation, now)
        credits.settle(self.ctx, session, "operator", lease, now)

    def done(self, session: Session, lease: Lease, now: dt.datetime, topic: str) -> Lease:
        lease.updated_at = now
        session.flush()
        session.refresh(lease)
        enqueue_lease(session, self.ctx.settings, topic, lease, now)
        self.ctx.events_changed(session, now)
        return lease


def _running(event: Event, now: dt.datetime) -> bool:
    return (
        event.status == EventStatus.IN_PROGRESS
        and event.claimed_until is not None
        and event.claimed_until > now
    )
