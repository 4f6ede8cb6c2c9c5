"""Changing a lease (re-admitted through the pipeline, a refusal explained afterwards) and
deleting one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK, retry_transient
from climate.db.tables import Event, Lease, Reservation
from climate.domain import lease_rules
from climate.domain.actor import Actor
from climate.domain.admission import AdmissionRefused, Admitted, Refused, Reshape, Reshaped
from climate.domain.requests import LeaseChanges, ReservationRequest
from climate.domain.status import (
    EVENT_ORDER,
    LEASE_TRANSITIONS,
    EventStatus,
    EventType,
    LeaseStatus,
    ReservationStatus,
    check_event_transition,
    check_lease_transition,
)
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity
from climate.fairshare import admission as fairshare
from climate.fairshare import credits
from climate.services import demand_record as demand
from climate.services.leases import offers
from climate.services.leases.admission import attempt, book
from climate.services.leases.base import (
    LeaseBase,
    check_name,
    event,
    record,
    reminder,
    started,
    window,
)


class Changing(LeaseBase):
    """Updates and deletions of leases."""

    @retry_transient
    def update(self, actor: Actor, lease_id: str, changes: LeaseChanges) -> Lease:
        """Change a lease; any new shape is re-admitted atomically or nothing changes.

        As Blazar: nothing to change answers the lease as it is; a new name alone is taken
        whatever the lease's state.

        :raises InvalidInput: the lease has ended (it can only be renamed), or its start moves
            after it began.
        :raises Conflict: the lease is in a state no change applies to (deleting, in error...).
        :raises AdmissionRefused: the new shape does not fit; the lease is left as it was. It
            carries the reason and counter-offers, each a body for this update
            (``offers.refuse_update``).
        """
        if changes.none:
            with self.ctx.db.reader() as session:
                return self._load(session, actor, lease_id, "blazar:leases:put")
        now = self.ctx.clock.now()
        asked: list[Reshape] = []
        outcome = attempt(
            self.ctx,
            lambda session: self._change(session, actor, lease_id, changes, now, asked),
            lock=ADMISSION_LOCK,
        )
        if isinstance(outcome, Admitted):
            return outcome.lease
        if outcome.broken is not None:
            if asked:
                shape = asked[0]
                reserved = [(r.resource_type, r.params) for r in shape.reservations]
                window = (shape.start, shape.end)
                demand.rule_broken(
                    self.ctx,
                    actor,
                    shape.name,
                    reserved,
                    window,
                    str(outcome.broken),
                    shape.lease_id,
                )
            raise outcome.broken
        if not asked:
            raise NotEnoughCapacity(outcome.message)
        explained = offers.refuse_update(
            self.ctx,
            outcome,
            changes,
            asked[0],
            lambda offered: self.would_update(actor, lease_id, offered),
        )
        demand.update_refused(self.ctx, actor, explained, asked[0])
        raise AdmissionRefused(explained)

    @retry_transient
    def would_update(self, actor: Actor, lease_id: str, changes: LeaseChanges) -> bool:
        """Whether ``update`` would accept ``changes`` now: the update itself, in a transaction
        rolled back at its end (as a dry run)."""
        now = self.ctx.clock.now()
        try:
            outcome = attempt(
                self.ctx,
                lambda session: self._change(session, actor, lease_id, changes, now, []),
                lock=ADMISSION_LOCK,
                rollback=True,
            )
        except (InvalidInput, Conflict):
            return False
        return not isinstance(outcome, Refused)

    def _change(
        self,
        session: Session,
        actor: Actor,
        lease_id: str,
        changes: LeaseChanges,
        now: dt.datetime,
        asked: list[Reshape],
    ) -> Lease:
        """``update`` in the caller's transaction, which holds the admission lock; the shape
        it admits is added to ``asked`` first."""
        held = lease_rows.hold_waiting_events(session, lease_id)
        lease = self._load(session, actor, lease_id, "blazar:leases:put", locked=True)
        if changes.renames_only:
            return self._renamed(session, actor, lease, changes.name, now)
        before = window(lease)
        active = started(lease, held)
        if lease.status == LeaseStatus.TERMINATED:
            # As Blazar, which looks at a new start before the end: an ended lease started.
            if _moves_start(lease, changes):
                raise _started_error(lease)
            raise InvalidInput(
                "body", f"Terminated leases can only be renamed (lease {lease.id} has ended)"
            )
        if lease.status not in (LeaseStatus.PENDING, LeaseStatus.ACTIVE):
            raise Conflict(f"lease {lease.id} is {lease.status} and can no longer be changed")
        self._rename(session, lease, changes.name)
        start, end = self._new_window(lease, changes, active, now)
        reshaped = (start, end) != (lease.start_date, lease.end_date)
        edits = self._match_reservations(lease, changes.reservations)
        for reservation, raw, where in edits:
            kind = self.ctx.resource_types[reservation.resource_type]
            if active:
                kind.check_running_change(raw, where)
            reservation.params = kind.validate(raw, reservation.params, where)
        if reshaped or edits:
            live = [
                r
                for r in lease.reservations
                if r.status not in (ReservationStatus.DELETED, ReservationStatus.ERROR)
            ]
            asked.append(_reshape(lease, start, end, active, live, edits))
            book(self.ctx, session, live, start, end, active=active, now=now)
            for reservation in live:
                reservation.updated_at = now  # booked again for the new window or parameters
        before_end = self._moved_before_end(lease, changes, start, end, reshaped)
        reminders = lease_rules.check_reminders(
            lease_rows.reminder_offsets(lease) if changes.reminders is None else changes.reminders,
            start,
            end,
            before_end,
            given=changes.reminders is not None,
            started=active,
        )
        old_end = lease.end_date
        lease.start_date, lease.end_date, lease.before_end_date = start, end, before_end
        lease.reminders = lease_rules.stored_reminders(reminders)
        rearmed = self._retime_events(lease, held, old_end, now)
        self._place_reminders(session, lease, reminders, old_end, held, now)
        lease.updated_at = now
        session.flush()
        if reshaped or edits:
            fairshare.admit(self.ctx, session, actor, lease, now, "update", before=before)
            credits.encumber(self.ctx, session, actor, lease, now, "update")
        else:
            fairshare.ask_update(self.ctx, session, actor, lease, before)
        self._notify(session, "lease.update", lease, now)
        if rearmed:
            self._notify(session, "lease.before_end.stop", lease, now)
        after = window(lease)
        changed = {
            k: [before.get(k), after.get(k)]
            for k in {**before, **after}
            if after.get(k) != before.get(k)
        }
        if edits:
            changed["reservations"] = [r.id for r, _, _ in edits]
        record(session, now, actor, "lease.update", lease, changed)
        waiting = [e.not_before for e in lease.events if e.status == EventStatus.UNDONE]
        if reshaped and lease_rows.queue_waits(session):
            waiting.append(now)  # a shorter lease frees capacity: the queue looks again
        if waiting:
            self.ctx.events_changed(session, min(waiting))
        return lease

    def _renamed(
        self, session: Session, actor: Actor, lease: Lease, name: str | None, now: dt.datetime
    ) -> Lease:
        """The lease with its new name alone, in any state (its window and resources stay)."""
        old = lease.name
        self._rename(session, lease, name)
        if lease.name != old:
            lease.updated_at = now
            session.flush()
            self._notify(session, "lease.update", lease, now)
            record(session, now, actor, "lease.update", lease, {"name": [old, lease.name]})
        return lease

    def _rename(self, session: Session, lease: Lease, name: str | None) -> None:
        if name is None or name == lease.name:
            return
        check_name(name)
        if lease_rows.name_taken(session, lease.project_id, name, other_than=lease.id):
            raise Conflict(f"name: a lease named {name!r} already exists")
        lease.name = name

    def _new_window(
        self, lease: Lease, changes: LeaseChanges, active: bool, now: dt.datetime
    ) -> tuple[dt.datetime, dt.datetime]:
        """The lease's window after ``changes``: a running lease's start stays, its end must
        be in the future."""
        start, end = lease.start_date, lease.end_date
        moved = _moves_start(lease, changes)
        if moved and active:
            raise _started_error(lease)
        if moved:
            start = lease_rules.check_start(None if changes.start_now else changes.start, now)
        if changes.end_now:
            end = now  # a running lease ends now, as Blazar reads "now"
        elif changes.end is not None:
            end = changes.end
            if active and end <= now:
                # Blazar compares with "now" to the minute, the CLI's precision: a running
                # lease given the current minute (`blazar lease-update --end-date`) ends now.
                if end < now.replace(second=0, microsecond=0):
                    raise InvalidInput(
                        "end_date",
                        "End date must be later than current and start date (a running lease "
                        "ends in the future, or now)",
                    )
                end = now
        lease_rules.check_window(start, end, "End date must be later than current and start date")
        return start, end

    def _moved_before_end(
        self,
        lease: Lease,
        changes: LeaseChanges,
        start: dt.datetime,
        end: dt.datetime,
        reshaped: bool,
    ) -> dt.datetime | None:
        before_end = lease.before_end_date
        moved_warning = changes.before_end is not None or changes.before_end_offset is not None
        if reshaped and not moved_warning and before_end is not None:
            # As in Blazar: the before-end action keeps its distance from the end.
            return max(start, end - (lease.end_date - before_end))
        if moved_warning or reshaped:
            return self._before_end(changes.before_end, start, end, changes.before_end_offset)
        return before_end

    @retry_transient
    def delete(self, actor: Actor, lease_id: str) -> None:
        """Delete a lease; a running one ends now and its resources go back to the free pool."""
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            self.cancel(session, actor, lease_id, now)

    def cancel(self, session: Session, actor: Actor, lease_id: str, now: dt.datetime) -> None:
        """Delete a lease in the caller's transaction, which holds the admission lock.

        :raises NotFound: no such lease visible to the caller.
        """
        held = lease_rows.hold_waiting_events(session, lease_id)
        # The row lock waits for a manager ending the lease right now (its end event is claimed,
        # so not held above): the status it commits is then the one read here.
        lease = self._load(session, actor, lease_id, "blazar:leases:delete", locked=True)
        has_started = started(lease, held)
        record(session, now, actor, "lease.delete", lease, {"status": lease.status})
        # As Blazar's delete_lease (its payload says so); but a start a manager has claimed runs
        # first, and the end moved to now then takes the resources back.
        starting = has_started and lease.status in (LeaseStatus.PENDING, LeaseStatus.STARTING)
        if not starting and LeaseStatus.DELETING in LEASE_TRANSITIONS[LeaseStatus(lease.status)]:
            lease.status = LeaseStatus.DELETING
        self._notify(session, "lease.delete", lease, now)
        lease.deleted_at = now
        lease.updated_at = now
        if not has_started:
            for event in held:
                session.delete(event)
            check_lease_transition(lease.status, LeaseStatus.TERMINATED)
            lease.status = LeaseStatus.TERMINATED
            for reservation in lease.reservations:
                self.ctx.resource_types[reservation.resource_type].release(
                    session, reservation, now
                )
                reservation.status = ReservationStatus.DELETED
            credits.settle(self.ctx, session, actor, lease, now)
            self._freed(session, now)
        elif lease.status != LeaseStatus.TERMINATED:
            # The manager takes the resources back through the backend, now. Events a
            # manager has taken meanwhile are left to it: they run before the end.
            for event in held:
                if event.event_type == EventType.END_LEASE:
                    event.time = event.not_before = now
                else:
                    session.delete(event)
            # An end that gave up (the lease is in ERROR) is tried again, with every attempt:
            # deleting asks for the resources back, and a DELETING lease no event will end
            # would stay so for good.
            for event in lease.events:
                if event.event_type == EventType.END_LEASE and event.status == EventStatus.ERROR:
                    check_event_transition(event.status, EventStatus.UNDONE)
                    event.status = EventStatus.UNDONE
                    event.attempts = 0
                    event.time = event.not_before = event.updated_at = now
            for reservation in lease.reservations:
                self.ctx.resource_types[reservation.resource_type].release(
                    session, reservation, now
                )
            credits.settle(self.ctx, session, actor, lease, now)
            self.ctx.events_changed(session, now)
        session.flush()

    def _match_reservations(
        self, lease: Lease, requested: Sequence[ReservationRequest]
    ) -> list[tuple[Reservation, dict[str, Any], str]]:
        """Each requested change with its reservation and where it is in the request: each
        names its reservation by id, one of this lease's (Blazar's rules and words)."""
        by_id = {r.id: r for r in lease.reservations}
        for i, req in enumerate(requested):
            if req.id is None:
                raise InvalidInput(
                    f"reservations[{i}].id",
                    "Missing parameter reservation ID (each reservation changed names its id; "
                    f"the lease has {len(lease.reservations)})",
                )
        unknown = [(i, req.id) for i, req in enumerate(requested) if req.id not in by_id]
        if unknown:
            raise InvalidInput(
                f"reservations[{unknown[0][0]}].id",
                "Please enter valid reservation IDs. Invalid reservation IDs are: "
                + ",".join(str(rid) for _, rid in unknown),
            )
        edits: list[tuple[Reservation, dict[str, Any], str]] = []
        for i, req in enumerate(requested):
            field_name = f"reservations[{i}]"
            target = by_id[str(req.id)]
            if req.resource_type not in (None, target.resource_type):
                raise InvalidInput(f"{field_name}.resource_type", "cannot be changed")
            edits.append((target, req.fields, field_name))
        return edits

    def _retime_events(
        self, lease: Lease, held: Sequence[Event], old_end: dt.datetime, now: dt.datetime
    ) -> bool:
        """Move the ``held`` events to the lease's dates; add a new warning if it is due again
        (and say so: Blazar notifies ``lease.event.before_end_lease.stop`` then)."""
        wanted = {
            EventType.START_LEASE: lease.start_date,
            EventType.END_LEASE: lease.end_date,
            EventType.BEFORE_END_LEASE: lease.before_end_date,
        }
        reminders = lease_rows.reminder_events(lease)
        for row in held:
            when = wanted.get(EventType(row.event_type))
            if when is not None and row.time != when and row not in reminders:
                row.time = row.not_before = when
                row.updated_at = now
        # A running lease warned already is warned again before a new end, as in Blazar: at
        # once if that warning's time has passed (an end brought forward, or made now), so that
        # its before-end action (a snapshot) runs again before the end.
        warned = [
            e
            for e in lease.events
            if e.event_type == EventType.BEFORE_END_LEASE and e not in reminders
        ]
        if (
            lease.before_end_date is not None
            and (lease.before_end_date > now or lease.end_date != old_end)
            and warned
            and all(e.status != EventStatus.UNDONE for e in warned)
        ):
            lease.events.append(
                event(lease.id, EventType.BEFORE_END_LEASE, lease.before_end_date, now)
            )
            return True
        return False

    def _place_reminders(
        self,
        session: Session,
        lease: Lease,
        offsets: Sequence[dt.timedelta],
        old_end: dt.datetime,
        held: Sequence[Event],
        now: dt.datetime,
    ) -> None:
        """Give the lease one reminder event per offset before its (new) end.

        A reminder that has not run (waiting, or skipped because its time had passed) moves
        or goes; one that ran stays as it was, as a plain before-end event of the lease's
        past, and a new one takes its place if its offset still applies at another time. A
        reminder a manager is running now is left alone."""
        held_ids = {e.id for e in held}
        current: set[dt.timedelta] = set()
        for row in lease_rows.reminder_events(lease):
            offset = old_end - row.time
            when = lease.end_date - offset
            if row.status == EventStatus.UNDONE and row.id not in held_ids:
                continue
            if row.status == EventStatus.IN_PROGRESS:
                continue
            if offset in offsets and row.time == when:
                current.add(offset)
            elif row.status == EventStatus.UNDONE or (
                row.status == EventStatus.DONE and row.attempts == 0
            ):
                if offset in offsets:
                    row.time = row.not_before = when
                    row.status = EventStatus.UNDONE if when >= now else EventStatus.DONE
                    row.updated_at = now
                    current.add(offset)
                else:
                    lease.events.remove(row)
                    session.delete(row)
            else:
                row.priority = EVENT_ORDER[EventType.BEFORE_END_LEASE]
                row.updated_at = now
        for offset in offsets:
            if offset not in current:
                lease.events.append(reminder(lease.id, lease.end_date - offset, now))


def _reshape(
    lease: Lease,
    start: dt.datetime,
    end: dt.datetime,
    active: bool,
    live: Sequence[Reservation],
    edits: Sequence[tuple[Reservation, dict[str, Any], str]],
) -> Reshape:
    """The shape an update asks admission for (kept to explain a refusal)."""
    sent = {r.id: raw for r, raw, _ in edits}
    return Reshape(
        lease.id,
        lease.start_date,
        lease.end_date,
        start,
        end,
        active,
        tuple(Reshaped(r.id, r.resource_type, dict(r.params), sent.get(r.id)) for r in live),
        lease.name,
    )


def _moves_start(lease: Lease, changes: LeaseChanges) -> bool:
    return changes.start_now or changes.start not in (None, lease.start_date)


def _started_error(lease: Lease) -> InvalidInput:
    return InvalidInput(
        "start_date",
        "Cannot modify the start date of already started leases (lease "
        f"{lease.id} started at {lease.start_date.isoformat()})",
    )
