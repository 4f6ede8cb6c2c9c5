"""Lease use cases: create, list, show, update, delete."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from climate import inputs, wire
from climate.db import audit
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK, retry_transient
from climate.db.tables import NAME_LENGTH, Event, Lease, Reservation, new_id
from climate.domain.actor import Actor
from climate.domain.status import (
    EVENT_ORDER,
    LEASE_TRANSITIONS,
    LIFECYCLE_ORDER,
    EventStatus,
    EventType,
    LeaseStatus,
    LeaseType,
    ReservationStatus,
    check_lease_transition,
)
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity, NotFound
from climate.fairshare import admission as fairshare
from climate.notify import enqueue_lease
from climate.resources import pick
from climate.services import offers
from climate.services.context import FIRST_PAGE, Page, ServiceContext
from climate.services.offers import RequestedWindow

# A start given as a date may lag the clock by this much (a client rounding "now" to the minute).
START_TOLERANCE = dt.timedelta(seconds=60)
WAITING_TYPES = frozenset({LeaseType.RETRY, LeaseType.BEST_EFFORT})
"""Lease types that wait in the queue (status IN_PROGRESS) when refused at creation."""
STARTING_NOW = (LeaseStatus.PENDING, LeaseStatus.STARTING)
POLL_SECONDS = 0.02
MAX_REMINDERS = 10
"""How many reminders a lease may have (docs/lease-types.md)."""


@dataclass(frozen=True)
class ReservationRequest:
    resource_type: str | None
    fields: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class LeaseRequest:
    name: str
    start: dt.datetime | None
    """None means now."""
    end: dt.datetime
    before_end: dt.datetime | None = None
    reservations: Sequence[ReservationRequest] = ()
    duration: dt.timedelta | None = None
    """A flexible window: the lease lasts this long, at the earliest start in [start, end]
    where it fits (``start`` and ``end`` are then ``earliest_start`` and ``latest_end``)."""
    dry_run: bool = False
    """Answer what would happen and write nothing."""
    lease_type: LeaseType = LeaseType.SCHEDULED
    priority: int | None = None
    """Place in the waiting queue (higher first); None: the default, 0."""
    retries: int | None = None
    """A retry lease's cap on admission attempts; None: ``retry_max_attempts``."""
    deadline: dt.datetime | None = None
    """When a best-effort lease stops hunting."""
    hold: dt.timedelta | None = None
    """Create a hold (HELD) that lapses after this long unless confirmed."""
    before_end_offset: dt.timedelta | None = None
    """The before-end event comes this long before the end (instead of ``before_end``)."""
    reminders: Sequence[dt.timedelta] | None = None
    """Extra notifications, each this long before the end."""
    series_id: str | None = None
    occurrence: dt.datetime | None = None
    """The instant of its series this lease is made for (``series_id``)."""
    requested_window: RequestedWindow | None = None
    """The flexible window this fixed request was placed in (kept on the lease)."""


@dataclass(frozen=True)
class LeaseChanges:
    name: str | None = None
    start: dt.datetime | None = None
    start_now: bool = False
    end: dt.datetime | None = None
    before_end: dt.datetime | None = None
    reservations: Sequence[ReservationRequest] = field(default_factory=tuple)
    before_end_offset: dt.timedelta | None = None
    reminders: Sequence[dt.timedelta] | None = None
    """None: keep the reminders' offsets (they move with the end); a list replaces them."""


@dataclass(frozen=True)
class Checked:
    """A lease request that passed every check that needs no capacity: ready to admit."""

    request: LeaseRequest
    start: dt.datetime
    before_end: dt.datetime
    reminders: tuple[dt.timedelta, ...]
    """Longest first."""
    prepared: Sequence[tuple[dict[str, Any], ReservationRequest]]
    """Each reservation's validated parameters, with its request."""

    @property
    def params(self) -> list[dict[str, Any]]:
        return [params for params, _ in self.prepared]


@dataclass(frozen=True)
class Trial:
    """What creating a lease answered (or a dry run would have)."""

    lease: Lease
    queue_position: int | None = None
    """A dry run's waiting lease: the place in the queue it would take, from 1."""


class LeaseService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    # -- reads -------------------------------------------------------------------------------

    def get(self, actor: Actor, lease_id: str) -> Lease:
        with self.ctx.db.reader() as session:
            return self._load(session, actor, lease_id, "blazar:leases:get")

    def list_all(
        self,
        actor: Actor,
        *,
        project_id: str | None = None,
        status: str | None = None,
        name: str | None = None,
        page: Page = FIRST_PAGE,
    ) -> Sequence[Lease]:
        """Live leases of the caller's project (of every project, or the one asked for, to
        those the ``admin`` rule allows), a page at a time.

        :raises InvalidInput: ``marker`` is not a lease of this listing, or a bad ``sort_key``.
        """
        self.ctx.policy.enforce(actor, "blazar:leases:get", actor.owner())
        scope = self.ctx.policy.scope(actor)
        if scope is not None:
            if project_id not in (None, scope):
                return []
            project_id = scope
        sort_key = page.key(lease_rows.LEASE_SORT_KEYS)
        with self.ctx.db.reader() as session:
            marker = None
            if page.marker is not None:
                marker = lease_rows.get(session, page.marker, project_id=scope)
                if marker is None:
                    raise InvalidInput("marker", "not the id of a lease in this listing")
            return lease_rows.list_live(
                session,
                project_id=project_id,
                status=status,
                name=name,
                limit=page.size(self.ctx.settings.max_page_size),
                marker=marker,
                sort_key=sort_key,
                descending=page.sort_dir == "desc",
            )

    # -- writes ------------------------------------------------------------------------------

    def create(self, actor: Actor, request: LeaseRequest) -> Lease:
        """Admit and record a lease, all or nothing. A flexible window (``duration``) is placed
        first (``offers.create_flexible``); a dry run is rolled back; a refusal carries its reason
        and counter-offers (docs/admission.md).

        :raises InvalidInput: a field is wrong (named in the message).
        :raises NotEnoughCapacity: not enough matching resources are free for the whole window.
        :raises Conflict: the project already has a live lease of that name.
        """
        return self._create(actor, request).lease

    def dry_run(self, actor: Actor, request: LeaseRequest) -> Trial:
        """What creating ``request`` would answer, writing nothing: the lease as it would be,
        admitted (with its allocations) or, for a retry or best-effort lease that does not fit
        now, waiting (IN_PROGRESS, the refusal in ``status_reason``) at the place in the queue
        it would take. Raises as ``create`` would."""
        return self._create(actor, dataclasses.replace(request, dry_run=True))

    @retry_transient
    def _create(self, actor: Actor, request: LeaseRequest) -> Trial:
        self.ctx.policy.enforce(actor, "blazar:leases:post", actor.owner())
        if request.duration is not None:
            if request.lease_type != LeaseType.SCHEDULED or request.hold is not None:
                raise InvalidInput("duration", "a flexible window is for scheduled leases only")
            return Trial(offers.create_flexible(self, actor, request, request.duration))
        now = self.ctx.clock.now()
        checked = self.check(actor, request, now)
        start = checked.start
        if request.lease_type in WAITING_TYPES:
            return self._create_waiting_type(actor, checked, now)
        with (
            offers.explaining(self.ctx, request, start, checked.params, actor),
            contextlib.suppress(offers.DryRun),
            self.ctx.db.transaction() as session,
        ):
            lease = self.write(session, actor, checked, now)
            if request.dry_run:
                raise offers.DryRun  # undoes every write above; the lease stays as built
        if request.lease_type == LeaseType.IMMEDIATE and not request.dry_run:
            return Trial(self._started_soon(actor, lease))
        return Trial(lease)  # fully loaded: the notification above rendered all of it

    def _create_waiting_type(self, actor: Actor, checked: Checked, now: dt.datetime) -> Trial:
        """A retry or best-effort lease: admitted now if it fits, else recorded as waiting (a
        dry run rolls either back, after reading where the lease would wait)."""
        dry_run = checked.request.dry_run
        try:
            with contextlib.suppress(offers.DryRun), self.ctx.db.transaction() as session:
                lease = self.write(session, actor, checked, now)
                if dry_run:
                    raise offers.DryRun
            return Trial(lease)
        except NotEnoughCapacity as refused:
            reason = str(refused)
        position = None
        with (
            contextlib.suppress(offers.DryRun),
            self.ctx.db.transaction(lock=ADMISSION_LOCK) as session,
        ):
            lease = self._write_waiting(session, actor, checked, now, reason)
            if dry_run:
                queue = [row.id for row in lease_rows.waiting(session)]
                position = queue.index(lease.id) + 1
                raise offers.DryRun
        return Trial(lease, position)

    def check(self, actor: Actor, request: LeaseRequest, now: dt.datetime) -> Checked:
        """Every check of a new lease with fixed dates that needs no capacity: its name,
        window, type, reservations, before-end event and reminders.

        :raises InvalidInput: a field is wrong (named in the message).
        """
        _check_name(request.name)
        start = self._check_start(request.start, now)
        _check_window(start, request.end)
        self._check_kind(actor, request, start, now)
        prepared = [
            (
                self._type_of(r, f"reservations[{i}]").validate(
                    r.fields, None, f"reservations[{i}]"
                ),
                r,
            )
            for i, r in enumerate(request.reservations)
        ]
        fairshare.check_request(
            self.ctx, actor, [r.resource_type for _, r in prepared], start, request.end, now
        )
        before_end = self._before_end(
            request.before_end, start, request.end, request.before_end_offset
        )
        reminders: tuple[dt.timedelta, ...] = ()
        if request.reminders is not None:
            reminders = _check_reminders(
                request.reminders, start, request.end, before_end, given=True, started=False
            )
        return Checked(request, start, before_end, reminders, prepared)

    def write(self, session: Session, actor: Actor, checked: Checked, now: dt.datetime) -> Lease:
        """Write and admit a new lease (HELD without events if it asks for a hold) in the
        caller's transaction, taking the admission lock unless the transaction holds it.

        :raises NotEnoughCapacity: it does not fit; the caller rolls the transaction back.
        :raises Conflict: the project already has a live lease of that name.
        """
        request, start = checked.request, checked.start
        lease = self._build(actor, checked, now)
        wake = start
        if request.hold is not None:
            lease.status = LeaseStatus.HELD
            lease.hold_expires_at = wake = min(now + request.hold, start)
        else:
            lease.events = _events(lease, now, checked.reminders)
        # Written with Core inserts and kept outside the session: nothing to flush or reload.
        # These rows are invisible to others until commit, so they go before the admission
        # lock: only the name check and the capacity decision are serialised.
        lease_rows.insert_new(session, lease)
        _audit(session, now, actor, "lease.create", lease, _window(lease))
        if "lock_version" not in session.info:
            self.ctx.db.lock(session, ADMISSION_LOCK)
        self._check_name_free(session, actor, lease)
        for reservation in lease.reservations:
            self.ctx.resource_types[reservation.resource_type].admit(
                session, reservation, start, request.end, active=False, now=now
            )
        fairshare.admit(self.ctx, session, actor, lease, now, "create", dry_run=request.dry_run)
        self._notify(session, "lease.create", lease, now)
        self.ctx.events_changed(session, wake)
        return lease

    def _write_waiting(
        self, session: Session, actor: Actor, checked: Checked, now: dt.datetime, reason: str
    ) -> Lease:
        """Record a refused retry or best-effort lease as waiting: no allocation, no event."""
        request = checked.request
        lease = self._build(actor, checked, now)
        lease.status = LeaseStatus.IN_PROGRESS
        lease.status_reason = reason
        lease.attempts = 1
        if request.lease_type == LeaseType.RETRY:
            lease.next_attempt_at = now + self._retry_interval
        self._check_name_free(session, actor, lease)
        lease_rows.insert_new(session, lease)
        _audit(session, now, actor, "lease.create", lease, _window(lease))
        self._notify(session, "lease.create", lease, now)
        self.ctx.events_changed(session, now)
        return lease

    def _check_name_free(self, session: Session, actor: Actor, lease: Lease) -> None:
        if lease_rows.name_taken(session, actor.project_id, lease.name, other_than=lease.id):
            raise Conflict(
                f"name: a lease named {lease.name!r} already exists in project {actor.project_id}"
            )

    def _build(self, actor: Actor, checked: Checked, now: dt.datetime) -> Lease:
        """The new lease as an object outside the session, every column set, PENDING."""
        request = checked.request
        window = request.requested_window
        lease_id = new_id()
        max_attempts = None
        if request.lease_type == LeaseType.RETRY:
            max_attempts = request.retries or self.ctx.settings.retry_max_attempts
        return Lease(
            id=lease_id,
            name=request.name,
            project_id=actor.project_id,
            user_id=actor.user_id,
            trust_id=None,
            start_date=checked.start,
            end_date=request.end,
            before_end_date=checked.before_end,
            status=LeaseStatus.PENDING,
            status_reason=None,
            degraded=False,
            deleted_at=None,
            lease_type=request.lease_type,
            priority=request.priority or 0,
            attempts=0,
            max_attempts=max_attempts,
            next_attempt_at=None,
            deadline=request.deadline,
            hold_expires_at=None,
            series_id=request.series_id,
            occurrence=request.occurrence,
            requested_earliest_start=window.earliest_start if window else None,
            requested_latest_end=window.latest_end if window else None,
            requested_duration_seconds=(int(window.duration.total_seconds()) if window else None),
            reminders=_stored(checked.reminders),
            created_at=now,
            updated_at=None,
            events=[],
            reservations=[
                Reservation(
                    id=new_id(),
                    lease_id=lease_id,
                    resource_type=req.resource_type,
                    resource_id=new_id(),
                    status=ReservationStatus.PENDING,
                    missing_resources=False,
                    resources_changed=False,
                    params=params,
                    created_at=now,
                    updated_at=None,
                )
                for params, req in checked.prepared
            ],
        )

    @retry_transient
    def update(self, actor: Actor, lease_id: str, changes: LeaseChanges) -> Lease:
        """Change a lease; any new shape is re-admitted atomically or nothing changes.

        :raises Conflict: the lease has ended, or its start moves after it began.
        :raises NotEnoughCapacity: the new shape does not fit; the lease is left as it was. It
            carries the reason and counter-offers, each a body for this update
            (``offers.explain_update``).
        """
        now = self.ctx.clock.now()
        asked: list[offers.Reshape] = []
        with (
            offers.explaining_update(self, actor, changes, asked),
            self.ctx.db.transaction(lock=ADMISSION_LOCK) as session,
        ):
            return self._change(session, actor, lease_id, changes, now, asked)

    @retry_transient
    def would_update(self, actor: Actor, lease_id: str, changes: LeaseChanges) -> bool:
        """Whether ``update`` would accept ``changes`` now: the update itself, in a transaction
        rolled back at its end (as a dry run)."""
        now = self.ctx.clock.now()
        try:
            with (
                contextlib.suppress(offers.DryRun),
                self.ctx.db.transaction(lock=ADMISSION_LOCK) as session,
            ):
                self._change(session, actor, lease_id, changes, now, [])
                raise offers.DryRun
        except (NotEnoughCapacity, InvalidInput, Conflict):
            return False
        return True

    def _change(
        self,
        session: Session,
        actor: Actor,
        lease_id: str,
        changes: LeaseChanges,
        now: dt.datetime,
        asked: list[offers.Reshape],
    ) -> Lease:
        """``update`` in the caller's transaction, which holds the admission lock; the shape
        it admits is added to ``asked`` first."""
        held = lease_rows.hold_waiting_events(session, lease_id)
        lease = self._load(session, actor, lease_id, "blazar:leases:put")
        before = _window(lease)
        active = _started(lease, held)
        if lease.status not in (LeaseStatus.PENDING, LeaseStatus.ACTIVE):
            raise Conflict(f"lease {lease.id} is {lease.status} and can no longer be changed")
        if changes.name is not None and changes.name != lease.name:
            _check_name(changes.name)
            if lease_rows.name_taken(session, lease.project_id, changes.name, other_than=lease.id):
                raise Conflict(f"name: a lease named {changes.name!r} already exists")
            lease.name = changes.name
        start, end = lease.start_date, lease.end_date
        if changes.start is not None or changes.start_now:
            if active:
                raise Conflict(f"start_date: lease {lease.id} has already started")
            start = self._check_start(None if changes.start_now else changes.start, now)
        if changes.end is not None:
            end = changes.end
            if active and end <= now:
                raise InvalidInput("end_date", "must be in the future for a running lease")
        _check_window(start, end, "End date must be later than current and start date")
        reshaped = (start, end) != (lease.start_date, lease.end_date)
        edits = self._match_reservations(lease, changes.reservations)
        for reservation, raw, where in edits:
            reservation.params = self.ctx.resource_types[reservation.resource_type].validate(
                raw, reservation.params, where
            )
        if reshaped or edits:
            live = [
                r
                for r in lease.reservations
                if r.status not in (ReservationStatus.DELETED, ReservationStatus.ERROR)
            ]
            sent = {r.id: raw for r, raw, _ in edits}
            asked.append(
                offers.Reshape(
                    lease.id,
                    lease.start_date,
                    lease.end_date,
                    start,
                    end,
                    active,
                    tuple(
                        offers.Reshaped(r.id, r.resource_type, dict(r.params), sent.get(r.id))
                        for r in live
                    ),
                )
            )
            for reservation in live:
                self.ctx.resource_types[reservation.resource_type].admit(
                    session, reservation, start, end, active=active, now=now
                )
        before_end = lease.before_end_date
        moved_warning = changes.before_end is not None or changes.before_end_offset is not None
        if reshaped and not moved_warning and before_end is not None:
            # As in Blazar: the before-end action keeps its distance from the end.
            before_end = max(start, end - (lease.end_date - before_end))
        elif moved_warning or reshaped:
            before_end = self._before_end(changes.before_end, start, end, changes.before_end_offset)
        reminders = _check_reminders(
            lease_rows.reminder_offsets(lease) if changes.reminders is None else changes.reminders,
            start,
            end,
            before_end,
            given=changes.reminders is not None,
            started=active,
        )
        old_end = lease.end_date
        lease.start_date, lease.end_date, lease.before_end_date = start, end, before_end
        lease.reminders = _stored(reminders)
        rearmed = self._retime_events(lease, held, now)
        self._place_reminders(session, lease, reminders, old_end, held, now)
        lease.updated_at = now
        session.flush()
        if reshaped or edits:
            fairshare.admit(self.ctx, session, actor, lease, now, "update", before=before)
        self._notify(session, "lease.update", lease, now)
        if rearmed:
            self._notify(session, "lease.before_end.stop", lease, now)
        after = _window(lease)
        changed = {
            k: [before.get(k), after.get(k)]
            for k in {**before, **after}
            if after.get(k) != before.get(k)
        }
        if edits:
            changed["reservations"] = [r.id for r, _, _ in edits]
        _audit(session, now, actor, "lease.update", lease, changed)
        waiting = [e.not_before for e in lease.events if e.status == EventStatus.UNDONE]
        if reshaped and lease_rows.queue_waits(session):
            waiting.append(now)  # a shorter lease frees capacity: the queue looks again
        if waiting:
            self.ctx.events_changed(session, min(waiting))
        return lease

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
        lease = self._load(session, actor, lease_id, "blazar:leases:delete")
        started = _started(lease, held)
        _audit(session, now, actor, "lease.delete", lease, {"status": lease.status})
        # As Blazar's delete_lease (its payload says so); but a start a manager has claimed runs
        # first, and the end moved to now then takes the resources back.
        starting = started and lease.status in (LeaseStatus.PENDING, LeaseStatus.STARTING)
        if not starting and LeaseStatus.DELETING in LEASE_TRANSITIONS[LeaseStatus(lease.status)]:
            lease.status = LeaseStatus.DELETING
        self._notify(session, "lease.delete", lease, now)
        lease.deleted_at = now
        lease.updated_at = now
        if not started:
            for event in held:
                session.delete(event)
            check_lease_transition(lease.status, LeaseStatus.TERMINATED)
            lease.status = LeaseStatus.TERMINATED
            for reservation in lease.reservations:
                self.ctx.resource_types[reservation.resource_type].release(
                    session, reservation, now
                )
                reservation.status = ReservationStatus.DELETED
            self._freed(session, now)
        elif lease.status != LeaseStatus.TERMINATED:
            # The manager takes the resources back through the backend, now. Events a
            # manager has taken meanwhile are left to it: they run before the end.
            for event in held:
                if event.event_type == EventType.END_LEASE:
                    event.time = event.not_before = now
                else:
                    session.delete(event)
            for reservation in lease.reservations:
                self.ctx.resource_types[reservation.resource_type].release(
                    session, reservation, now
                )
            self.ctx.events_changed(session, now)
        session.flush()

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
            lease.events.extend(_events(lease, now, lease_rows.reminder_offsets(lease)))
            session.flush()
            fairshare.admit(self.ctx, session, actor, lease, now, "confirm")
            self._notify(session, "lease.update", lease, now, "lease.hold.confirm")
            _audit(session, now, actor, "lease.confirm", lease, {"status": LeaseStatus.PENDING})
            self.ctx.events_changed(session, lease.start_date)
        return lease

    # -- the waiting queue (run by the manager) ---------------------------------------------

    def queue_positions(self) -> dict[str, int]:
        """Each waiting lease's place in the queue, from 1, across every project."""
        with self.ctx.db.reader() as session:
            return {row.id: i for i, row in enumerate(lease_rows.waiting(session), start=1)}

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
        try:
            with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
                lease = lease_rows.get_for_update(session, lease_id)
                if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                    return 0
                shift = now - lease.start_date
                start, end = now, lease.end_date + shift
                for reservation in lease.reservations:
                    self.ctx.resource_types[reservation.resource_type].admit(
                        session, reservation, start, end, active=False, now=now
                    )
                self.admitted_from_queue(session, lease, now)
            return 1
        except NotEnoughCapacity as refused:
            self._refused(lease_id, str(refused), now)
            return 0

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
        lease.events.extend(_events(lease, now, lease_rows.reminder_offsets(lease)))
        session.flush()
        fairshare.admit(self.ctx, session, "manager", lease, now, "queue")
        self._notify(session, "lease.update", lease, now, "lease.waiting.admit")
        self.ctx.events_changed(session, now)

    def _refused(self, lease_id: str, reason: str, now: dt.datetime) -> None:
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
            else:
                lease.next_attempt_at = now + self._retry_interval
                lease_rows.signal_event_change(session, lease.next_attempt_at)

    def _give_up(self, lease_id: str, status: LeaseStatus, reason: str) -> None:
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                return
            check_lease_transition(lease.status, status)
            lease.status = status
            lease.status_reason = f"{reason}; last refusal: {lease.status_reason}"
            lease.updated_at = now
            self._notify(session, "lease.error", lease, now)

    def _lapse(self, lease_id: str, now: dt.datetime) -> None:
        """Release an unconfirmed hold whose expiry has come."""
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
            self._notify(session, "lease.update", lease, now, "lease.hold.expire")

    # -- helpers -----------------------------------------------------------------------------

    def _freed(self, session: Session, now: dt.datetime) -> None:
        """Capacity freed: wake the manager if leases wait for it."""
        if lease_rows.queue_waits(session):
            self.ctx.events_changed(session, now)

    @property
    def _retry_interval(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.ctx.settings.retry_interval_seconds)

    def _check_kind(
        self, actor: Actor, request: LeaseRequest, start: dt.datetime, now: dt.datetime
    ) -> None:
        """The fields of lease types, priority and holds, each against its own rules."""
        kind = request.lease_type
        if kind != LeaseType.SCHEDULED and request.start is not None and start > now:
            raise InvalidInput("start_date", f"an {kind} lease starts now; give 'now'")
        if request.priority is not None and request.priority > 0:
            self.ctx.policy.enforce(actor, "climate:leases:priority", actor.owner())
        for i, r in enumerate(request.reservations):
            # Reclaim (docs/lease-types.md); its value itself is checked by physical:host.
            asked = str(r.fields.get("reclaim", False)).strip().lower() not in ("false", "none")
            if r.resource_type == "physical:host" and asked:
                if kind != LeaseType.BEST_EFFORT:
                    raise InvalidInput(
                        f"reservations[{i}].reclaim", "only for lease_type 'best_effort'"
                    )
                self.ctx.policy.enforce(actor, "climate:leases:reclaim", actor.owner())
        if request.retries is not None:
            if kind != LeaseType.RETRY:
                raise InvalidInput("retries", "only for lease_type 'retry'")
            cap = self.ctx.settings.retry_max_attempts
            if not 1 <= request.retries <= cap:
                raise InvalidInput("retries", f"must be between 1 and {cap}")
        if kind == LeaseType.BEST_EFFORT:
            if request.deadline is None:
                raise InvalidInput("deadline", "required for lease_type 'best_effort'")
            if request.deadline <= now:
                raise InvalidInput("deadline", "must be in the future")
        elif request.deadline is not None:
            raise InvalidInput("deadline", "only for lease_type 'best_effort'")
        if request.hold is not None:
            if kind != LeaseType.SCHEDULED:
                raise InvalidInput("hold", "only scheduled leases can be held")
            if start <= now:
                raise InvalidInput("hold", "a hold needs a start_date in the future")
            if (
                not dt.timedelta(0)
                < request.hold
                <= dt.timedelta(seconds=self.ctx.settings.hold_max_seconds)
            ):
                raise InvalidInput(
                    "hold.expires_in",
                    f"must be between 1 and {self.ctx.settings.hold_max_seconds} seconds",
                )

    def _started_soon(self, actor: Actor, lease: Lease) -> Lease:
        """The immediate lease once the manager has started it (or failed to), waiting at most
        ``immediate_wait_seconds``; as it stands then otherwise."""
        deadline = time.monotonic() + self.ctx.settings.immediate_wait_seconds
        while lease.status in STARTING_NOW and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            lease = self.get(actor, lease.id)
        return lease

    def _load(self, session: Session, actor: Actor, lease_id: str, rule: str) -> Lease:
        """The lease if the caller may see it and ``rule`` allows the action on it. Another
        project's lease is not found (404, not 403): its existence is not given away."""
        lease = lease_rows.get(session, lease_id, project_id=self.ctx.policy.scope(actor))
        if lease is None:
            raise NotFound("Lease", lease_id)
        self.ctx.policy.enforce(
            actor, rule, {"project_id": lease.project_id, "user_id": lease.user_id}
        )
        return lease

    def _type_of(self, request: ReservationRequest, field: str) -> Any:
        return pick(self.ctx.resource_types, request.resource_type, f"{field}.resource_type")

    def _check_start(self, start: dt.datetime | None, now: dt.datetime) -> dt.datetime:
        if start is None:
            return now
        if start < now - START_TOLERANCE:
            raise InvalidInput(
                "start_date", f"{start.isoformat()} is in the past; use 'now' or a future date"
            )
        return start

    def _before_end(
        self,
        given: dt.datetime | None,
        start: dt.datetime,
        end: dt.datetime,
        offset: dt.timedelta | None = None,
    ) -> dt.datetime:
        if offset is not None:
            if not dt.timedelta(0) <= offset <= end - start:
                raise InvalidInput(
                    "before_end_offset", f"must be between 0 and the lease's length ({end - start})"
                )
            return end - offset
        if given is not None:
            if not start <= given <= end:
                raise InvalidInput("before_end_date", "must lie between start_date and end_date")
            return given
        default = end - dt.timedelta(minutes=self.ctx.settings.minutes_before_end_lease)
        return max(default, start)

    def _match_reservations(
        self, lease: Lease, requested: Sequence[ReservationRequest]
    ) -> list[tuple[Reservation, dict[str, Any], str]]:
        """Each requested change with its reservation and where it is in the request."""
        by_id = {r.id: r for r in lease.reservations}
        edits: list[tuple[Reservation, dict[str, Any], str]] = []
        for i, req in enumerate(requested):
            field_name = f"reservations[{i}]"
            if req.id is None:
                if len(lease.reservations) != 1:
                    raise InvalidInput(
                        f"{field_name}.id",
                        "Missing parameter reservation ID (the lease has "
                        f"{len(lease.reservations)} reservations)",
                    )
                target = lease.reservations[0]
            elif req.id not in by_id:
                raise InvalidInput(f"{field_name}.id", f"no reservation {req.id} in this lease")
            else:
                target = by_id[req.id]
            if req.resource_type not in (None, target.resource_type):
                raise InvalidInput(f"{field_name}.resource_type", "cannot be changed")
            edits.append((target, req.fields, field_name))
        return edits

    def _retime_events(self, lease: Lease, held: Sequence[Event], now: dt.datetime) -> bool:
        """Move the ``held`` events to the lease's dates; add a new warning if it is due again
        (and say so: Blazar notifies ``lease.event.before_end_lease.stop`` then)."""
        wanted = {
            EventType.START_LEASE: lease.start_date,
            EventType.END_LEASE: lease.end_date,
            EventType.BEFORE_END_LEASE: lease.before_end_date,
        }
        reminders = lease_rows.reminder_events(lease)
        for event in held:
            when = wanted.get(EventType(event.event_type))
            if when is not None and event.time != when and event not in reminders:
                event.time = event.not_before = when
                event.updated_at = now
        # A running lease whose end moved later gets its warning again before the new end.
        warned = [
            e
            for e in lease.events
            if e.event_type == EventType.BEFORE_END_LEASE and e not in reminders
        ]
        if (
            lease.before_end_date is not None
            and lease.before_end_date > now
            and warned
            and all(e.status != EventStatus.UNDONE for e in warned)
        ):
            lease.events.append(
                _event(lease.id, EventType.BEFORE_END_LEASE, lease.before_end_date, now)
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
        for event in lease_rows.reminder_events(lease):
            offset = old_end - event.time
            when = lease.end_date - offset
            if event.status == EventStatus.UNDONE and event.id not in held_ids:
                continue
            if event.status == EventStatus.IN_PROGRESS:
                continue
            if offset in offsets and event.time == when:
                current.add(offset)
            elif event.status == EventStatus.UNDONE or (
                event.status == EventStatus.DONE and event.attempts == 0
            ):
                if offset in offsets:
                    event.time = event.not_before = when
                    event.status = EventStatus.UNDONE if when >= now else EventStatus.DONE
                    event.updated_at = now
                    current.add(offset)
                else:
                    lease.events.remove(event)
                    session.delete(event)
            else:
                event.priority = EVENT_ORDER[EventType.BEFORE_END_LEASE]
                event.updated_at = now
        for offset in offsets:
            if offset not in current:
                lease.events.append(_reminder(lease.id, lease.end_date - offset, now))

    def _notify(
        self,
        session: Session,
        topic: str,
        lease: Lease,
        now: dt.datetime,
        event_type: str | None = None,
    ) -> None:
        enqueue_lease(session, self.ctx.settings, topic, lease, now, event_type)


def _events(lease: Lease, now: dt.datetime, reminders: Sequence[dt.timedelta] = ()) -> list[Event]:
    """A lease's start, before-end and end events, and a reminder per offset, in time order."""
    wanted = [
        (EventType.START_LEASE, lease.start_date),
        (EventType.END_LEASE, lease.end_date),
        (EventType.BEFORE_END_LEASE, lease.before_end_date),
    ]
    events = [_event(lease.id, kind, when, now) for kind, when in wanted if when is not None]
    events.extend(_reminder(lease.id, lease.end_date - offset, now) for offset in reminders)
    return sorted(events, key=lambda e: e.time)


def _stored(offsets: Sequence[dt.timedelta]) -> list[int] | None:
    """Reminders' offsets as ``Lease.reminders`` keeps them: whole seconds, longest first."""
    return sorted((int(o.total_seconds()) for o in offsets), reverse=True) or None


def _reminder(lease_id: str, when: dt.datetime, now: dt.datetime) -> Event:
    """A reminder: a before-end event that only notifies. One whose time has passed is
    recorded as skipped: DONE without an attempt."""
    event = _event(lease_id, EventType.BEFORE_END_LEASE, when, now)
    event.priority = lease_rows.REMINDER_PRIORITY
    if when < now:
        event.status = EventStatus.DONE
    return event


def _check_reminders(
    offsets: Sequence[dt.timedelta],
    start: dt.datetime,
    end: dt.datetime,
    before_end: dt.datetime | None,
    *,
    given: bool,
    started: bool,
) -> tuple[dt.timedelta, ...]:
    """The reminders' offsets, longest first. ``given``: the client sent them (errors name
    each); else they are the lease's own, kept as its window changes: one longer than a
    running lease has passed (it is skipped), but a lease that has not started must be
    longer than each of its reminders."""
    if len(offsets) > MAX_REMINDERS:
        raise InvalidInput("reminders", f"at most {MAX_REMINDERS}, not {len(offsets)}")
    seen: dict[dt.timedelta, int] = {}
    for i, offset in enumerate(offsets):
        where = f"reminders[{i}]" if given else "reminders"
        shown = wire.duration(offset)
        if offset <= dt.timedelta(0):
            raise InvalidInput(where, f"must be a positive duration, not {shown}")
        if offset > end - start and (given or not started):
            raise InvalidInput(
                where, f"{shown} is longer than the lease ({wire.duration(end - start)})"
            )
        if offset in seen:
            raise InvalidInput(where, f"{shown} repeats reminders[{seen[offset]}]")
        if end - offset == before_end:
            raise InvalidInput(where, f"{shown} falls on before_end_date, which notifies already")
        seen[offset] = i
    return tuple(sorted(offsets, reverse=True))


def _event(lease_id: str, kind: EventType, when: dt.datetime, now: dt.datetime) -> Event:
    return Event(
        id=new_id(),
        lease_id=lease_id,
        event_type=kind,
        time=when,
        not_before=when,
        priority=EVENT_ORDER[kind],
        seq=LIFECYCLE_ORDER[kind],
        status=EventStatus.UNDONE,
        attempts=0,
        last_error=None,
        claimed_by=None,
        claimed_until=None,
        done_at=None,
        created_at=now,
        updated_at=None,
    )


def _started(lease: Lease, held: Sequence[Event]) -> bool:
    """Whether the lease has started, or a manager is starting it: its status has moved on, or
    its start is not among its waiting events, ``held`` by this transaction (a manager took it
    and will write ACTIVE, even if the lease still shows PENDING). Waiting and held leases
    have no events and have not started."""
    if lease.status in (LeaseStatus.IN_PROGRESS, LeaseStatus.HELD):
        return False
    return lease.status != LeaseStatus.PENDING or all(
        e.event_type != EventType.START_LEASE for e in held
    )


def _window(lease: Lease) -> dict[str, object]:
    window: dict[str, object] = {
        "name": lease.name,
        "start_date": lease.start_date,
        "end_date": lease.end_date,
        "before_end_date": lease.before_end_date,
    }
    reminders = lease_rows.reminder_offsets(lease)
    if reminders:
        window["reminders"] = [wire.duration(o) for o in reminders]
    return window


def _audit(
    session: Session,
    now: dt.datetime,
    actor: Actor,
    action: str,
    lease: Lease,
    detail: Mapping[str, object],
) -> None:
    audit.record(
        session,
        at=now,
        actor=actor,
        action=action,
        target_type="lease",
        target_id=lease.id,
        detail={"project_id": lease.project_id, **detail},
    )


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("name", "a lease needs a non-empty name")
    if len(name) > NAME_LENGTH:
        raise InvalidInput("name", f"at most {NAME_LENGTH} characters, not {len(name)}")
    inputs.name_text("name", name)


def _check_window(
    start: dt.datetime, end: dt.datetime, blazar: str = "End date must be later than start date."
) -> None:
    """``blazar``: Blazar's words for an inverted window (its update says it differently)."""
    if end <= start:
        raise InvalidInput(
            "end_date",
            f"{blazar} ({end.isoformat()} is not after start_date {start.isoformat()})",
        )
