"""Holds: admitted leases without events until confirmed, released when they lapse."""

from __future__ import annotations

import datetime as dt

from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.records import RefusedDemand
from climate.db.tables import Lease
from climate.domain.actor import Actor
from climate.domain.status import LeaseStatus, ReservationStatus, check_lease_transition
from climate.errors import Conflict
from climate.fairshare import admission as fairshare
from climate.fairshare import credits
from climate.services import demand_record as demand
from climate.services.leases.base import LeaseBase, new_events, record


class Holds(LeaseBase):
    """Confirming a hold, and lapsing one nobody confirmed."""

    def confirm(self, actor: Actor, lease_id: str) -> Lease:
        """Confirm a hold: it becomes a PENDING lease that starts at its start date, with its
        events (its reminders' too, from their stored offsets).

        :raises Conflict: the lease is not HELD, or its hold has lapsed.
        """
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            lease = self._load(session, actor, lease_id, "climate:leases:confirm")
            if lease.status != LeaseStatus.HELD:
                raise Conflict(f"lease {lease.id} is {lease.status}, not HELD: nothing to confirm")
            assert lease.hold_expires_at is not None
            if lease.hold_expires_at <= now:
                raise Conflict(f"lease {lease.id}: its hold lapsed at {lease.hold_expires_at}")
            check_lease_transition(lease.status, LeaseStatus.PENDING)
            lease.status = LeaseStatus.PENDING
            lease.hold_expires_at = None
            lease.updated_at = now
            lease.events.extend(new_events(lease, now, lease_rows.reminder_offsets(lease)))
            session.flush()
            fairshare.admit(self.ctx, session, actor, lease, now, "confirm")
            credits.encumber(self.ctx, session, actor, lease, now, "confirm")
            self._notify(session, "lease.update", lease, now, "lease.hold.confirm")
            record(session, now, actor, "lease.confirm", lease, {"status": LeaseStatus.PENDING})
            self.ctx.events_changed(session, lease.start_date)
        return lease

    def _lapse(self, lease_id: str, now: dt.datetime) -> None:
        """Release an unconfirmed hold whose expiry has come."""
        unserved: list[RefusedDemand] = []
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.HELD:
                return
            for reservation in lease.reservations:
                self.ctx.resource_types[reservation.resource_type].release(
                    session, reservation, now
                )
                reservation.status = ReservationStatus.DELETED
            check_lease_transition(lease.status, LeaseStatus.EXPIRED)
            lease.status = LeaseStatus.EXPIRED
            lease.status_reason = f"hold not confirmed by {lease.hold_expires_at}"
            lease.updated_at = now
            session.flush()
            credits.settle(self.ctx, session, "manager", lease, now)
            self._notify(session, "lease.update", lease, now, "lease.hold.expire")
            unserved = demand.unserved(self.ctx, lease, demand.ABANDONED, "hold_expired")
        demand.record(self.ctx, unserved)
