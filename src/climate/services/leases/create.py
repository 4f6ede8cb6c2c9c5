"""Creating a lease: its checks, then admission through the pipeline (``admission``), a
refusal explained afterwards (``offers``); waiting types and holds are recorded here too."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK, retry_transient
from climate.db.tables import Lease, Reservation, attach, built, new_id
from climate.domain import lease_rules
from climate.domain.actor import Actor
from climate.domain.admission import AdmissionRefused, Admitted, Refused
from climate.domain.lease_rules import WAITING_TYPES
from climate.domain.requests import LeaseRequest, ReservationRequest
from climate.domain.status import LeaseStatus, LeaseType, ReservationStatus
from climate.errors import InvalidInput
from climate.fairshare import admission as fairshare
from climate.fairshare import credits
from climate.services import demand_record as demand
from climate.services.leases import offers
from climate.services.leases.admission import attempt, book
from climate.services.leases.base import LeaseBase, check_name, new_events, record, window

STARTING_NOW = (LeaseStatus.PENDING, LeaseStatus.STARTING)
POLL_SECONDS = 0.02


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
    trust_id: str | None = None
    """The lessee's Keystone trust, where the lease needs one (``ServiceContext.delegate``)."""

    @property
    def params(self) -> list[dict[str, Any]]:
        return [params for params, _ in self.prepared]


@dataclass(frozen=True)
class Trial:
    """What creating a lease answered (or a dry run would have)."""

    lease: Lease
    queue_position: int | None = None
    """A dry run's waiting lease: the place in the queue it would take, from 1."""
    quote: Decimal | None = None
    """What the lease costs in credits (None: credits are off, or it was not admitted)."""


class Creating(LeaseBase):
    """Creating leases: checked, admitted, or recorded as waiting."""

    def create(self, actor: Actor, request: LeaseRequest) -> Lease:
        """Admit and record a lease, all or nothing. A flexible window (``duration``) is placed
        first (``offers.create_flexible``); a dry run is rolled back; a refusal is explained, its
        reason and counter-offers found after it (``offers.refuse``, docs/admission.md).

        :raises InvalidInput: a field is wrong (named in the message).
        :raises AdmissionRefused: not enough matching resources are free for the whole window.
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
            return Trial(
                offers.create_flexible(
                    self.ctx,
                    actor,
                    request,
                    request.duration,
                    lambda fixed: self.create(actor, fixed),
                )
            )
        now = self.ctx.clock.now()
        checked = self.check(actor, request, now)
        if not request.dry_run:
            types = [r.resource_type for _, r in checked.prepared]
            checked = dataclasses.replace(checked, trust_id=self.ctx.delegate(actor, types))
        try:
            trial = self._admit(actor, checked, now)
        except BaseException:
            self.ctx.forget_trust(checked.trust_id)  # no lease holds it
            raise
        if request.lease_type == LeaseType.IMMEDIATE and not request.dry_run:
            return dataclasses.replace(trial, lease=self._started_soon(actor, trial.lease))
        return trial

    def _admit(self, actor: Actor, checked: Checked, now: dt.datetime) -> Trial:
        request = checked.request
        if request.lease_type in WAITING_TYPES:
            return self._create_waiting_type(actor, checked, now)
        outcome = attempt(
            self.ctx,
            lambda session: self.write(session, actor, checked, now),
            rollback=request.dry_run,  # the lease stays as built, with nothing of it written
            shared=self._books_per_resource(checked),
        )
        if isinstance(outcome, Refused):
            if outcome.broken is not None:
                if not request.dry_run:
                    reserved = [(str(r.resource_type), p) for p, r in checked.prepared]
                    asked = (checked.start, request.end)
                    demand.rule_broken(
                        self.ctx, actor, request.name, reserved, asked, str(outcome.broken)
                    )
                raise outcome.broken
            explained = offers.refuse(
                self.ctx, outcome, request, checked.start, checked.params, actor
            )
            if request.requested_window is None:  # a flexible window's tries: its caller records
                demand.lease_refused(self.ctx, actor, explained)
            raise AdmissionRefused(explained)
        # Fully loaded: the notification rendered all of it.
        return Trial(outcome.lease, quote=credits.quoted(outcome.lease))

    def _create_waiting_type(self, actor: Actor, checked: Checked, now: dt.datetime) -> Trial:
        """A retry or best-effort lease: admitted now if it fits, else recorded as waiting (a
        dry run rolls either back, after reading where the lease would wait)."""
        dry_run = checked.request.dry_run
        outcome = attempt(
            self.ctx,
            lambda session: self.write(session, actor, checked, now),
            rollback=dry_run,
            shared=self._books_per_resource(checked),
        )
        if isinstance(outcome, Admitted):
            return Trial(outcome.lease, quote=credits.quoted(outcome.lease))
        position = None
        with self.ctx.db.transaction(lock=ADMISSION_LOCK, rollback=dry_run) as session:
            lease = self._write_waiting(session, actor, checked, now, outcome.message)
            if dry_run:
                queue = [row.id for row in lease_rows.waiting(session)]
                position = queue.index(lease.id) + 1
        return Trial(lease, position)

    def _books_per_resource(self, checked: Checked) -> bool:
        return all(self._type_of(r, "reservations").books_per_resource for _, r in checked.prepared)

    def check(self, actor: Actor, request: LeaseRequest, now: dt.datetime) -> Checked:
        """Every check of a new lease with fixed dates that needs no capacity: its name,
        window, type, reservations, before-end event and reminders.

        :raises InvalidInput: a field is wrong (named in the message).
        """
        check_name(request.name)
        start = lease_rules.check_start(request.start, now)
        lease_rules.check_window(start, request.end)
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
            reminders = lease_rules.check_reminders(
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
            attach(lease, "events", new_events(lease, now, checked.reminders))
        # Written with Core inserts and kept outside the session: nothing to flush or reload.
        # These rows are invisible to others until commit, so they go before the admission
        # lock: only the capacity decision is serialised. The name is the unique index's.
        lease_rows.insert_new(session, lease)
        record(session, now, actor, "lease.create", lease, window(lease))
        if not self.ctx.db.admitting(session):
            self.ctx.db.lock(session, ADMISSION_LOCK)
        book(self.ctx, session, lease.reservations, start, request.end, active=False, now=now)
        fairshare.admit(self.ctx, session, actor, lease, now, "create", dry_run=request.dry_run)
        credits.encumber(self.ctx, session, actor, lease, now, "create", dry_run=request.dry_run)
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
        lease_rows.insert_new(session, lease)
        record(session, now, actor, "lease.create", lease, window(lease))
        self._notify(session, "lease.create", lease, now)
        self.ctx.events_changed(session, now)
        return lease

    def _build(self, actor: Actor, checked: Checked, now: dt.datetime) -> Lease:
        """The new lease as an object outside the session, every column set, PENDING."""
        request = checked.request
        window = request.requested_window
        lease_id = new_id()
        max_attempts = None
        if request.lease_type == LeaseType.RETRY:
            max_attempts = request.retries or self.ctx.settings.retry_max_attempts
        return built(
            Lease,
            id=lease_id,
            name=request.name,
            project_id=actor.project_id,
            user_id=actor.user_id,
            trust_id=checked.trust_id,
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
            reminders=lease_rules.stored_reminders(checked.reminders),
            created_at=now,
            updated_at=None,
            events=[],
            reservations=[
                built(
                    Reservation,
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
                longest = self.ctx.settings.hold_max_seconds
                raise InvalidInput(
                    request.hold_field,
                    f"a hold lasts from 1 second to {longest} seconds ({longest / 60:g} minutes)",
                )

    def _started_soon(self, actor: Actor, lease: Lease) -> Lease:
        """The immediate lease once the manager has started it (or failed to), waiting at most
        ``immediate_wait_seconds``; as it stands then otherwise."""
        deadline = time.monotonic() + self.ctx.settings.immediate_wait_seconds
        while lease.status in STARTING_NOW and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            lease = self.get(actor, lease.id)
        return lease
