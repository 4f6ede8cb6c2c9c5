"""A project's actions on one reservation of its lease, as its policies allow: start a manual
reservation, acknowledge the end of a keep-until-ack one; deleting a lease, which
acknowledges what its ended reservations kept (docs/policies.md); and changing a running
lease, whose new resources are handed over at once."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from climate.backends.base import (
    Acknowledge,
    Action,
    Backend,
    Handover,
    Replace,
    StartManual,
    Timeboxed,
)
from climate.context import ServiceContext
from climate.db import assignments, audit
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Lease, Reservation
from climate.domain.actor import Actor
from climate.domain.requests import LeaseChanges
from climate.domain.status import EndPolicy, LeaseStatus, ReservationStatus, StartPolicy
from climate.errors import BackendError, Conflict, NotFound
from climate.notify import enqueue_lease
from climate.resources.base import ACKNOWLEDGED_AT, STARTED_AT, end_policy_of, start_policy_of
from climate.services import backend_records
from climate.services.leases import LeaseService


@dataclass(frozen=True)
class _Action:
    """One action: its policy rule and audit name, what refuses it, the backend action and
    its record, and the params key that records it."""

    rule: str
    name: str
    refusal: Callable[[Reservation], str | None]
    action: Callable[[Handover], Action]
    record: Callable[[Session, Handover], None]
    stamp: str


def _start_refusal(reservation: Reservation) -> str | None:
    if start_policy_of(reservation.params) is not StartPolicy.MANUAL:
        return "starts automatically (start_policy auto): there is nothing to start"
    if STARTED_AT in reservation.params:
        return f"was started already, at {reservation.params[STARTED_AT]}"
    if reservation.status != ReservationStatus.ACTIVE:
        return f"is {reservation.status}: only an active reservation can be started"
    return None


def _acknowledge_refusal(reservation: Reservation) -> str | None:
    policy = end_policy_of(reservation.params)
    if policy is not EndPolicy.KEEP_UNTIL_ACK:
        return f"ends with end_policy {policy}: nothing is kept to acknowledge"
    if ACKNOWLEDGED_AT in reservation.params:
        return f"was acknowledged already, at {reservation.params[ACKNOWLEDGED_AT]}"
    if reservation.status != ReservationStatus.DELETED:
        return f"is {reservation.status}: nothing is kept before it has ended"
    return None


START = _Action(
    rule="climate:leases:start_reservation",
    name="reservation.start",
    refusal=_start_refusal,
    action=StartManual,
    record=backend_records.started_manually,
    stamp=STARTED_AT,
)
ACKNOWLEDGE = _Action(
    rule="climate:leases:acknowledge",
    name="reservation.acknowledge",
    refusal=_acknowledge_refusal,
    action=Acknowledge,
    record=backend_records.acknowledged,
    stamp=ACKNOWLEDGED_AT,
)


DISCARD = replace(ACKNOWLEDGE, rule="blazar:leases:delete")
"""Acknowledging by deleting the lease: the delete rule allows it."""


class ReservationActionService:
    """Start and acknowledge reservations through the backend, from the API.

    Each action checks the lease and reservation in a read transaction, runs the backend's
    remote part outside any transaction (given up after ``backend_timeout_seconds``), then, in
    one transaction under the admission lock (every change to a reservation's params takes
    it), checks again, lets the backend record, stamps the reservation's params, writes an
    audit row and queues a ``lease.update`` notification. A failed or abandoned remote part
    changes nothing; the call may be repeated (backends are idempotent).
    """

    def __init__(self, ctx: ServiceContext, backend: Backend) -> None:
        self.ctx = ctx
        self.backend = Timeboxed(backend, ctx.settings.backend_timeout_seconds)
        self.leases = LeaseService(ctx)

    def start(self, actor: Actor, lease_id: str, reservation_id: str) -> Lease:
        """Start a manual reservation, held since the lease started: the backend starts the
        project's workload, and the reservation shows ``started_at``.

        :raises NotFound: no such lease (or another project's), or no such reservation in it.
        :raises Forbidden: the ``climate:leases:start_reservation`` rule refuses the caller.
        :raises Conflict: the reservation is not manual, was started already, or is not active.
        :raises BackendError: the backend failed or did not answer in time; nothing changed.
        """
        return self._run(START, actor, lease_id, reservation_id)

    def acknowledge(self, actor: Actor, lease_id: str, reservation_id: str) -> Lease:
        """Acknowledge the end of a keep-until-ack reservation: the backend discards the
        workload its end kept, and the reservation shows ``acknowledged: true``.

        :raises NotFound: no such lease (or another project's), or no such reservation in it.
        :raises Forbidden: the ``climate:leases:acknowledge`` rule refuses the caller.
        :raises Conflict: the reservation's end policy is another, it was acknowledged
            already, or it has not ended.
        :raises BackendError: the backend failed or did not answer in time; nothing changed.
        """
        return self._run(ACKNOWLEDGE, actor, lease_id, reservation_id)

    def delete_lease(self, actor: Actor, lease_id: str) -> None:
        """Delete a lease (``LeaseService.delete``). Deleting is the acknowledgement of what
        its ended keep-until-ack reservations kept: the backend discards each first, as
        ``acknowledge`` would (remote part outside any transaction), then one transaction
        records and audits each (``reservation.acknowledge``) and deletes the lease. A running
        lease's end applies ``release`` instead (the manager's part).

        :raises NotFound: no such lease (or another project's).
        :raises Forbidden: the ``blazar:leases:delete`` rule refuses the caller.
        :raises BackendError: the backend failed to discard or did not answer in time; the
            lease is not deleted, and the call may be repeated.
        """
        kept: list[Handover] = []
        with self.ctx.db.reader() as session:
            # Only an ended reservation keeps anything. A lease without one, most leases, is
            # not read here: ``cancel`` finds it and applies the same rule alone.
            if lease_rows.has_ended_reservation(session, lease_id):
                lease = self._lease(session, DISCARD, actor, lease_id, whole=False)
                now = self.ctx.clock.now()
                kept = [
                    self.ctx.handover(lease, r, now)
                    for r in lease.reservations
                    if DISCARD.refusal(r) is None
                ]
        for handover in kept:
            self._remote(DISCARD, handover)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            if kept:  # else ``cancel`` finds the lease and applies the same rule alone
                lease = self._lease(session, DISCARD, actor, lease_id)
                for handover in kept:
                    found = [r for r in lease.reservations if r.id == handover.reservation_id]
                    if found and DISCARD.refusal(found[0]) is None:  # else acknowledged
                        self._record(session, DISCARD, actor, lease, found[0], handover, now)
            self.leases.cancel(session, actor, lease_id, now)

    def update_lease(self, actor: Actor, lease_id: str, changes: LeaseChanges) -> Lease:
        """Change a lease (``LeaseService.update``). As Blazar's update adds the hosts a
        running reservation gains to its aggregate (and, for instances, to its inventory), the
        backend is then told of each host a running reservation holds that was not handed
        over yet (``Replace`` with no old host), and the hand-over is recorded.

        :raises BackendError: the lease was changed, but the backend failed to hand a new host
            over or did not answer in time; the same update, repeated, tries again.
        """
        lease = self.leases.update(actor, lease_id, changes)
        if lease.status != LeaseStatus.ACTIVE:
            return lease
        with self.ctx.db.reader() as session:
            grown = self._not_handed_over(session, lease_id)
        for action in grown:
            try:
                self.backend.one(action)
            except Exception as exc:
                raise BackendError(
                    f"lease {lease_id} was changed, but backend {self.backend.name} failed to "
                    f"hand host {action.new_host} over to reservation "
                    f"{action.handover.reservation_id}: {exc}"
                ) from exc
            with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
                backend_records.replaced(session, action)
        return lease

    def _not_handed_over(self, session: Session, lease_id: str) -> list[Replace]:
        """One ``Replace(handover, None, host)`` per host an active reservation of the lease
        holds more of than was handed over (hosts, or instance slots ``<host>:<n>``)."""
        lease = lease_rows.get(session, lease_id)
        if lease is None:
            return []
        handed = {
            (a.reservation_id, a.resource_id)
            for a in assignments.for_lease(session, lease_id)
            if a.released_at is None
        }
        now = self.ctx.clock.now()
        grown: list[Replace] = []
        for reservation in lease.reservations:
            if reservation.status != ReservationStatus.ACTIVE:
                continue
            handover = self.ctx.handover(lease, reservation, now)
            hosts = {
                resource_id.partition(":")[0]
                for resource_id in handover.resource_ids
                if (reservation.id, resource_id) not in handed
            }
            grown += [Replace(handover, None, host) for host in sorted(hosts)]
        return grown

    def _run(self, action: _Action, actor: Actor, lease_id: str, reservation_id: str) -> Lease:
        with self.ctx.db.reader() as session:
            lease, reservation = self._find(session, action, actor, lease_id, reservation_id)
            handover = self.ctx.handover(lease, reservation, self.ctx.clock.now())
        self._remote(action, handover)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            lease, reservation = self._find(session, action, actor, lease_id, reservation_id)
            self._record(session, action, actor, lease, reservation, handover, now)
            enqueue_lease(session, self.ctx.settings, "lease.update", lease, now)
        return lease

    def _remote(self, action: _Action, handover: Handover) -> None:
        """The backend's part of ``action``, outside any transaction.

        :raises BackendError: it failed or did not answer in time.
        """
        try:
            self.backend.one(action.action(handover))
        except Exception as exc:
            raise BackendError(
                f"reservation {handover.reservation_id}: backend {self.backend.name} failed to "
                f"{action.name.partition('.')[2]}: {exc}"
            ) from exc

    def _record(
        self,
        session: Session,
        action: _Action,
        actor: Actor,
        lease: Lease,
        reservation: Reservation,
        handover: Handover,
        now: dt.datetime,
    ) -> None:
        """The backend's record part, the reservation's stamp and the audit row, in the
        caller's transaction under the admission lock."""
        # The backend's rows first, then the reservation's and lease's: the manager's order.
        action.record(session, handover)
        reservation.params = {**reservation.params, action.stamp: now.isoformat()}
        reservation.updated_at = lease.updated_at = now
        session.flush()
        audit.record(
            session,
            at=now,
            actor=actor,
            action=action.name,
            target_type="reservation",
            target_id=reservation.id,
            detail={"lease_id": lease.id, "project_id": lease.project_id},
        )

    def _find(
        self, session: Session, action: _Action, actor: Actor, lease_id: str, reservation_id: str
    ) -> tuple[Lease, Reservation]:
        """The lease and its reservation, if the caller may act on them; another project's
        lease is not found (404), as everywhere."""
        lease = self._lease(session, action, actor, lease_id)
        found = [r for r in lease.reservations if r.id == reservation_id]
        if not found:
            raise NotFound("Reservation", reservation_id)
        refused = action.refusal(found[0])
        if refused is not None:
            raise Conflict(f"reservation {reservation_id} {refused}")
        return lease, found[0]

    def _lease(
        self, session: Session, action: _Action, actor: Actor, lease_id: str, whole: bool = True
    ) -> Lease:
        scope = self.ctx.policy.scope(actor)
        lease = lease_rows.get(session, lease_id, project_id=scope, whole=whole)
        if lease is None:
            raise NotFound("Lease", lease_id, "lease_id")
        self.ctx.policy.enforce(
            actor, action.rule, {"project_id": lease.project_id, "user_id": lease.user_id}
        )
        return lease
