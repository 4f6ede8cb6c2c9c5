"""The waiting queue, served by the manager: retry and best-effort leases refused at creation,
admitted through the pipeline when capacity allows (docs/lease-types.md)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.records import RefusedDemand
from climate.db.tables import Lease
from climate.domain.admission import Refused
from climate.domain.status import LeaseStatus, LeaseType, check_lease_transition
from climate.fairshare import admission as fairshare
from climate.fairshare import credits
from climate.services import demand_record as demand
from climate.services.leases.admission import attempt, book
from climate.services.leases.base import new_events
from climate.services.leases.holds import Holds


class Queue(Holds):
    """Serving the waiting queue (holds lapse first: they free capacity)."""

    def serve_queue(self, capacity_changed: bool) -> int:
        """Lapse expired holds, time out best-effort leases past their deadline, then try to
        admit the waiting leases in queue order (docs/lease-types.md), each in its own
        transaction: retry leases whose attempt is due, best-effort leases if
        ``capacity_changed`` (or a hold lapsed just now). Returns how many were admitted."""
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            lapsing = lease_rows.lapsed_holds(session, now)
            queue = lease_rows.waiting(session)
        for lease_id in lapsing:
            self._lapse(lease_id, now)
        capacity_changed = capacity_changed or bool(lapsing)
        admitted = 0
        for row in queue:
            if row.lease_type == LeaseType.BEST_EFFORT:
                if row.deadline is not None and row.deadline <= now:
                    self._give_up(row.id, LeaseStatus.TIMEDOUT, "no capacity before the deadline")
                    continue
                if not capacity_changed:
                    continue
            elif row.next_attempt_at is not None and row.next_attempt_at > now:
                continue
            admitted += self._attempt(row.id, now)
        return admitted

    def _attempt(self, lease_id: str, now: dt.datetime) -> int:
        """Admit a waiting lease now for its duration; on a refusal count the attempt."""

        def admit(session: Session) -> Lease | None:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                return None
            end = lease.end_date + (now - lease.start_date)
            book(self.ctx, session, lease.reservations, now, end, active=False, now=now)
            self.admitted_from_queue(session, lease, now)
            return lease

        outcome = attempt(self.ctx, admit, lock=ADMISSION_LOCK)
        if isinstance(outcome, Refused):
            self._refused(lease_id, outcome.message, now)
            return 0
        return 0 if outcome.lease is None else 1

    def admitted_from_queue(self, session: Session, lease: Lease, now: dt.datetime) -> None:
        """Record that waiting ``lease`` was admitted (its reservations over [now, now +
        its duration), by the caller): PENDING from now, with its events (its reminders' too,
        from their stored offsets), notified. Its before-end date keeps its distance from
        the end."""
        shift = now - lease.start_date
        check_lease_transition(lease.status, LeaseStatus.PENDING)
        lease.status = LeaseStatus.PENDING
        lease.status_reason = None
        lease.attempts += 1
        lease.next_attempt_at = None
        lease.start_date, lease.end_date = now, lease.end_date + shift
        if lease.before_end_date is not None:
            lease.before_end_date += shift
        lease.updated_at = now
        lease.events.extend(new_events(lease, now, lease_rows.reminder_offsets(lease)))
        session.flush()
        fairshare.admit(self.ctx, session, "manager", lease, now, "queue")
        credits.encumber(self.ctx, session, "manager", lease, now, "queue")
        self._notify(session, "lease.update", lease, now, "lease.waiting.admit")
        self.ctx.events_changed(session, now)

    def _refused(self, lease_id: str, reason: str, now: dt.datetime) -> None:
        unserved: list[RefusedDemand] = []
        with self.ctx.db.transaction() as session:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                return
            lease.attempts += 1
            lease.status_reason = reason
            lease.updated_at = now
            if lease.lease_type != LeaseType.RETRY:
                return
            if lease.max_attempts is not None and lease.attempts >= lease.max_attempts:
                check_lease_transition(lease.status, LeaseStatus.ERROR)
                lease.status = LeaseStatus.ERROR
                lease.next_attempt_at = None
                lease.status_reason = f"refused {lease.attempts} time(s); last: {reason}"
                self._notify(session, "lease.error", lease, now)
                unserved = demand.unserved(self.ctx, lease, demand.GAVE_UP, "attempts")
            else:
                lease.next_attempt_at = now + self._retry_interval
                lease_rows.signal_event_change(session, lease.next_attempt_at)
        demand.record(self.ctx, unserved)

    def _give_up(self, lease_id: str, status: LeaseStatus, reason: str) -> None:
        now = self.ctx.clock.now()
        unserved: list[RefusedDemand] = []
        with self.ctx.db.transaction() as session:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                return
            check_lease_transition(lease.status, status)
            lease.status = status
            lease.status_reason = f"{reason}; last refusal: {lease.status_reason}"
            lease.updated_at = now
            self._notify(session, "lease.error", lease, now)
            unserved = demand.unserved(self.ctx, lease, demand.TIMED_OUT, "deadline")
        demand.record(self.ctx, unserved)
