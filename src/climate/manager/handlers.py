"""What each event does to its lease, decided per event and applied per batch.

``decide`` looks at one event and its lease (as loaded, with the changes of the events before it
in the same pass on top, in ``Statuses``) and returns a ``Step``: which statuses move, which
reservations the backend hands over or takes back. It writes nothing, so the manager may decide
ahead of the due instant. ``apply`` takes the steps of a *segment* (events of one type, each of
a different lease), asks the backend to do all their side effects in one call, then writes the
new statuses and marks the events DONE in a few statements. An event whose step or backend item
fails changes nothing and is reported; the others stand.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from climate.backends.base import (
    Action,
    BeforeEnd,
    Done,
    End,
    Handover,
    Outcome,
    Start,
    Timeboxed,
)
from climate.context import ServiceContext
from climate.db import audit
from climate.db import events as event_rows
from climate.db.engine import AFTER_COMMIT
from climate.db.tables import Event, Lease, Reservation
from climate.domain.status import (
    LEASE_TRANSITIONS,
    EndPolicy,
    EventStatus,
    EventType,
    LeaseStatus,
    ReservationStatus,
    check_lease_transition,
    check_reservation_transition,
)
from climate.fairshare import credits
from climate.notify import enqueue_lease, enqueue_leases
from climate.services import backend_records
from climate.services.power import PowerService

LOG = logging.getLogger(__name__)

# The lease status an event puts the lease in while its backend work runs.
TRANSITIONAL = {
    EventType.START_LEASE: LeaseStatus.STARTING,
    EventType.END_LEASE: LeaseStatus.TERMINATING,
}

AUDIT_ACTOR = "manager"
"""The audit log's ``actor_user`` for what the manager does."""

Finish = Callable[[Session, list[str], dt.datetime], None]
"""Marks events DONE, given when their work finished."""


def mark_in_progress(lease: Lease, event: Event) -> None:
    """Move the lease to its transitional status when its start or end event is claimed."""
    lease.status = _marked(lease.status, EventType(event.event_type))


def _marked(status: str, kind: EventType) -> str:
    """The lease status once an event of ``kind`` is under way (unchanged when the transitional
    status is already there or out of reach: the handler then sees that and does nothing)."""
    target = TRANSITIONAL.get(kind)
    if target is None or target not in LEASE_TRANSITIONS[LeaseStatus(status)]:
        return status
    return target


@dataclass
class Step:
    """What one event changes, decided before anything is written."""

    event_id: str
    lease: Lease
    lease_status: LeaseStatus | None = None
    """The lease's status once the event is done; None: unchanged."""
    reservation_status: ReservationStatus | None = None
    reservations: list[Reservation] = field(default_factory=list)
    """The reservations that go to ``reservation_status``."""
    handovers: list[Handover] = field(default_factory=list)
    """What the backend works on: one per reservation, at the time the step was decided for."""
    actions: list[str] = field(default_factory=list)
    """Before-end: the action of each handover."""
    releases: list[Reservation] = field(default_factory=list)
    """End before the lease's end date: reservations whose resources go back early."""
    topic: str | None = None
    """The notification; an event that notifies also sets the lease's ``updated_at``."""


class Statuses:
    """Lease and reservation statuses as they are during a pass: as loaded, with the changes of
    the steps done (or, ahead of time, planned) before on top."""

    def __init__(self) -> None:
        self._leases: dict[str, str] = {}
        self._reservations: dict[str, str] = {}

    def lease(self, lease: Lease) -> str:
        return self._leases.get(lease.id, lease.status)

    def reservation(self, reservation: Reservation) -> str:
        return self._reservations.get(reservation.id, reservation.status)

    def record(self, step: Step) -> None:
        if step.lease_status is not None:
            self._leases[step.lease.id] = step.lease_status
        if step.reservation_status is not None:
            for reservation in step.reservations:
                self._reservations[reservation.id] = step.reservation_status


class EventHandlers:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed, manager: str) -> None:
        self.ctx = ctx
        self.backend = backend
        self.manager = manager

    # -- deciding ----------------------------------------------------------------------------

    def decide(
        self,
        kind: EventType,
        event_id: str,
        lease: Lease,
        statuses: Statuses,
        now: dt.datetime,
        *,
        reminder: bool = False,
    ) -> Step:
        """What event ``event_id`` of type ``kind`` does to ``lease`` at ``now``.

        :param reminder: a before-end event that only notifies (``lease_rows.reminder_ids``);
            the one at the lease's ``before_end_date`` also runs the reservations' actions.
        :raises Conflict: a status transition the tables do not allow.
        """
        step = Step(event_id, lease)
        status = statuses.lease(lease)
        if kind is EventType.START_LEASE:
            if _marked(status, kind) != LeaseStatus.STARTING:
                return step  # deleted or ended before it could start: nothing to hand out
            self._move(
                step,
                self._live(lease, statuses),
                statuses,
                (LeaseStatus.STARTING, LeaseStatus.ACTIVE),
                ReservationStatus.ACTIVE,
                now,
            )
            step.topic = "lease.start"
        elif kind is EventType.END_LEASE:
            ending_as = _marked(status, kind)
            if ending_as not in (LeaseStatus.TERMINATING, LeaseStatus.DELETING):
                return step
            ending = [
                r
                for r in lease.reservations
                if statuses.reservation(r) != ReservationStatus.DELETED
            ]
            self._move(
                step,
                ending,
                statuses,
                (LeaseStatus(ending_as), LeaseStatus.TERMINATED),
                ReservationStatus.DELETED,
                now,
            )
            # Resources are allocated over the lease's window, so once its end date has come
            # there is nothing left to give back; an earlier end (a deleted running lease)
            # gives back what lies after ``now``.
            if ends_early(lease, now):
                step.releases = ending
            step.topic = "lease.end"
        else:
            if status != LeaseStatus.ACTIVE or lease.deleted_at is not None:
                return step
            step.topic = "lease.before_end"
            if reminder:
                return step
            live = self._live(lease, statuses)
            step.handovers = [self._handover(lease, r, now) for r in live]
            step.actions = [str(r.params.get("before_end", "default")) for r in live]
        return step

    def _move(
        self,
        step: Step,
        reservations: list[Reservation],
        statuses: Statuses,
        lease_move: tuple[LeaseStatus, LeaseStatus],
        reservation_status: ReservationStatus,
        now: dt.datetime,
    ) -> None:
        """Check and record that the lease and these reservations change status, with the
        backend hand-over of each reservation."""
        for reservation in reservations:
            check_reservation_transition(statuses.reservation(reservation), reservation_status)
        check_lease_transition(*lease_move)
        step.lease_status = lease_move[1]
        step.reservation_status = reservation_status
        step.reservations = reservations
        step.handovers = [self._handover(step.lease, r, now) for r in reservations]

    def _handover(self, lease: Lease, reservation: Reservation, now: dt.datetime) -> Handover:
        handover = self.ctx.handover(lease, reservation, now)
        if handover.end_policy is EndPolicy.KEEP_UNTIL_ACK and lease.deleted_at is not None:
            # A deleted lease cannot be acknowledged: its deletion is the acknowledgement.
            return replace(handover, end_policy=EndPolicy.RELEASE)
        return handover

    @staticmethod
    def _live(lease: Lease, statuses: Statuses) -> list[Reservation]:
        return [
            r
            for r in lease.reservations
            if statuses.reservation(r) in (ReservationStatus.PENDING, ReservationStatus.ACTIVE)
        ]

    # -- applying ----------------------------------------------------------------------------

    def apply(
        self,
        session: Session,
        kind: EventType,
        steps: Sequence[Step | BaseException],
        now: dt.datetime,
        finish: Finish,
    ) -> list[Outcome]:
        """Do the steps of a segment (all of type ``kind``, each of its own lease; an exception
        in place of a step is a decision that failed) and ``finish`` the successful events;
        returns one outcome per step. Raises only when the segment as a whole could not be
        written (the caller rolls it back and applies the steps one by one)."""
        todo: list[Step | BaseException] = list(steps)
        self._release(session, todo, now)
        self._backend(session, kind, todo, now)
        self._write(session, kind, [s for s in todo if isinstance(s, Step)], now, finish)
        return [s if isinstance(s, BaseException) else None for s in todo]

    def _release(
        self, session: Session, steps: list[Step | BaseException], now: dt.datetime
    ) -> None:
        """Early ends give their resources back, each in a savepoint of its own, before the
        backend: a failure leaves that event undone and nothing of it written."""
        for i, step in enumerate(steps):
            if not isinstance(step, Step) or not step.releases:
                continue
            try:
                with session.begin_nested():
                    for reservation in step.releases:
                        resource_type = self.ctx.resource_types[reservation.resource_type]
                        resource_type.release(session, reservation, now)
            except Exception as exc:
                steps[i] = exc

    def _backend(
        self, session: Session, kind: EventType, steps: list[Step | BaseException], now: dt.datetime
    ) -> None:
        """One backend call for the segment (an action per event), then the records of the
        actions it did, in bulk: a failed write fails the segment, which is rerun one event at a
        time."""
        busy = [(i, s) for i, s in enumerate(steps) if isinstance(s, Step) and s.handovers]
        if kind is EventType.START_LEASE and busy:
            self._wake_hosts(session, busy, steps, now)
            busy = [(i, s) for i, s in busy if steps[i] is s]
        if not busy:
            return
        actions: list[Action]
        if kind is EventType.START_LEASE:
            actions = [Start(tuple(s.handovers)) for _, s in busy]
        elif kind is EventType.END_LEASE:
            actions = [End(tuple(s.handovers)) for _, s in busy]
        else:
            actions = [BeforeEnd(tuple(zip(s.handovers, s.actions, strict=True))) for _, s in busy]
        results = self.backend.handle(actions)
        if len(results) != len(busy):
            raise RuntimeError(
                f"backend {self.backend.name} returned {len(results)} results "
                f"for {len(busy)} events"
            )
        done: list[Step] = []
        for (i, step), result in zip(busy, results, strict=True):
            if isinstance(result, BaseException):
                steps[i] = result
            else:
                done.append(step)
                if isinstance(result, Done):
                    backend_records.made(step.reservations, result)
        handovers = [h for step in done for h in step.handovers]
        if kind is EventType.START_LEASE:
            backend_records.started(session, handovers)
        elif kind is EventType.END_LEASE:
            backend_records.ended(session, handovers)
            for step in done:
                if step.lease.trust_id is not None:  # ended: the lease needs its trust no more
                    session.info.setdefault(AFTER_COMMIT, []).append(
                        partial(self.ctx.forget_trust, step.lease.trust_id)
                    )

    def _wake_hosts(
        self,
        session: Session,
        busy: list[tuple[int, Step]],
        steps: list[Step | BaseException],
        now: dt.datetime,
    ) -> None:
        """No lease starts on a host the power policy powered down: wake such hosts first; a
        start whose host did not wake fails (and is retried) instead."""
        hosts = {
            int(host_id): name
            for _, step in busy
            for handover in step.handovers
            for host_id, name in handover.hosts.items()
            if host_id.isdigit()
        }
        failed = PowerService(self.ctx, self.backend).wake_for_start(session, hosts, now)
        for i, step in busy:
            asleep = sorted(
                {h for handover in step.handovers for h in handover.hosts if h.isdigit()}
                & {str(h) for h in failed}
            )
            if asleep:
                steps[i] = RuntimeError(
                    "host(s) "
                    + ", ".join(asleep)
                    + " did not wake from power saving: "
                    + "; ".join(str(failed[int(h)]) for h in asleep)
                )

    def _write(
        self, session: Session, kind: EventType, done: list[Step], now: dt.datetime, finish: Finish
    ) -> None:
        """Statuses of the leases and reservations that moved, then the events and their audit
        rows: one statement per (table, new status)."""
        leases: dict[str | None, list[str]] = defaultdict(list)
        reservations: dict[str, list[str]] = defaultdict(list)
        for step in done:
            if step.lease_status is not None or step.topic is not None:
                leases[step.lease_status].append(step.lease.id)
            if step.reservation_status is not None and step.reservations:
                reservations[step.reservation_status].extend(r.id for r in step.reservations)
        for status, ids in leases.items():
            event_rows.set_lease_status(session, ids, status, now)
        for status, ids in reservations.items():
            event_rows.set_reservation_status(session, ids, status, now)
        for step in done:
            if kind is EventType.END_LEASE and step.lease_status is LeaseStatus.TERMINATED:
                credits.settle(self.ctx, session, AUDIT_ACTOR, step.lease, now)
        # When the events' work finished (the batch commits a few ms later), for lag figures.
        finished = self.ctx.clock.now()
        finish(session, [s.event_id for s in done], finished)
        audit.record_many(
            session,
            at=now,
            actor_user=AUDIT_ACTOR,
            action=f"event.{kind}",
            target_type="event",
            items=[(s.event_id, {"lease_id": s.lease.id, "manager": self.manager}) for s in done],
        )
        notices = [s for s in done if s.topic is not None]
        if not self.ctx.settings.notification_sinks or not notices:
            return
        # The notification shows the lease as the API will: bring the loaded copy up to date
        # (without making it dirty: it is written already).
        for step in notices:
            set_committed_value(step.lease, "updated_at", now)
            if step.lease_status is not None:
                set_committed_value(step.lease, "status", str(step.lease_status))
            for reservation in step.reservations:
                set_committed_value(reservation, "status", str(step.reservation_status))
                set_committed_value(reservation, "updated_at", now)
            for event in step.lease.events:  # the one that ran is DONE, as Blazar shows it
                if event.id == step.event_id:
                    set_committed_value(event, "status", str(EventStatus.DONE))
                    set_committed_value(event, "updated_at", finished)
        enqueue_leases(
            session,
            self.ctx.settings,
            [(s.topic, s.lease, None) for s in notices if s.topic is not None],
            now,
        )

    # -- giving up ---------------------------------------------------------------------------

    def fail(self, session: Session, lease: Lease, reason: str, now: dt.datetime) -> None:
        """The event gave up: the lease and its live reservations go to ERROR with the reason."""
        if lease.status != LeaseStatus.ERROR:
            check_lease_transition(lease.status, LeaseStatus.ERROR)
            lease.status = LeaseStatus.ERROR
        lease.status_reason = reason
        for reservation in lease.reservations:
            if reservation.status in (ReservationStatus.PENDING, ReservationStatus.ACTIVE):
                check_reservation_transition(reservation.status, ReservationStatus.ERROR)
                reservation.status = ReservationStatus.ERROR
        lease.updated_at = now
        enqueue_lease(session, self.ctx.settings, "lease.error", lease, now)
        audit.record(
            session,
            at=now,
            actor=AUDIT_ACTOR,
            action="lease.error",
            target_type="lease",
            target_id=lease.id,
            detail={"reason": reason, "manager": self.manager},
        )


def ends_early(lease: Lease, now: dt.datetime) -> bool:
    """An end event before the lease's end date (a running lease deleted): its resources must
    be given back through the resource type."""
    return now < lease.end_date
