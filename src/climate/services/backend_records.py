"""What the callers of a backend write once it reported an action done: who holds what
(``assignments``, one row per resource handed to a project, with the state the end policy left
the workload in) and the parameters the backend made for a reservation. The backend itself
never sees the database."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Sequence

from sqlalchemy.orm import Session

from climate.backends.base import Done, Handover, Migration, Replace
from climate.db import assignments
from climate.db import reclaim as reclaim_rows
from climate.db.assignments import State
from climate.db.tables import Reservation
from climate.domain.status import EndPolicy, StartPolicy

LOG = logging.getLogger(__name__)
INSTANCES = "virtual:instance"

ENDED: dict[EndPolicy, State] = {
    EndPolicy.RELEASE: State.RELEASED,
    EndPolicy.DELETE: State.DELETED,
    EndPolicy.SUSPEND: State.SUSPENDED,
    EndPolicy.SNAPSHOT: State.SNAPSHOTTED,
    EndPolicy.KEEP_UNTIL_ACK: State.KEPT,
}
"""The state an end policy leaves the workload in."""


def _grants(handover: Handover) -> list[assignments.Grant]:
    held = handover.start_policy == StartPolicy.MANUAL
    return [
        assignments.Grant(
            reservation_id=handover.reservation_id,
            lease_id=handover.lease_id,
            project_id=handover.project_id,
            resource_type=handover.resource_type,
            resource_id=resource_id,
            at=handover.at,
            start_policy=handover.start_policy,
            end_policy=handover.end_policy,
            state=State.HELD if held else State.RUNNING,
        )
        for resource_id in handover.resource_ids
    ]


def started(session: Session, handovers: Sequence[Handover]) -> int:
    """The resources are the projects' (held, for a manual start); returns how many were new.
    Bulk, and idempotent: a repeated start records nothing twice."""
    added = assignments.assign_many(session, [g for h in handovers for g in _grants(h)])
    if handovers:
        LOG.info("%d reservation(s) started: %d resource(s) handed out", len(handovers), added)
    return added


def ended(session: Session, handovers: Sequence[Handover]) -> int:
    """The resources are back, the workload in the state each end policy leaves it; one
    statement per (time, end policy), usually one."""
    groups: dict[tuple[dt.datetime, EndPolicy], list[str]] = {}
    for h in handovers:
        groups.setdefault((h.at, h.end_policy), []).append(h.reservation_id)
    released = 0
    for (at, policy), reservation_ids in groups.items():
        released += assignments.release_many(
            session, reservation_ids, at, end_policy=policy, state=ENDED[policy]
        )
    if groups:
        LOG.info("%d reservation(s) ended: %d resource(s) released", len(handovers), released)
    return released


def started_manually(session: Session, handover: Handover) -> None:
    count = assignments.move_state(session, handover.reservation_id, State.HELD, State.RUNNING)
    LOG.info(
        "lease %s: reservation %s started by its project (%d resource(s))",
        handover.lease_id,
        handover.reservation_id,
        count,
    )


def acknowledged(session: Session, handover: Handover) -> None:
    count = assignments.move_state(session, handover.reservation_id, State.KEPT, State.RELEASED)
    LOG.info(
        "lease %s: reservation %s acknowledged, %d kept resource(s) discarded",
        handover.lease_id,
        handover.reservation_id,
        count,
    )


def migrated(session: Session, moves: Sequence[Migration]) -> None:
    """Each move on the reservation's instance slots: those on the old host are released and as
    many are assigned on the new one (a reservation not started yet has none)."""
    for m in moves:
        count = reclaim_rows.reassign(
            session, m.reservation_id, m.from_host, m.to_host, m.count, m.at
        )
        LOG.info(
            "lease %s: %d instance(s) of reservation %s moved from host %s to host %s",
            m.lease_id,
            count,
            m.reservation_id,
            m.from_host,
            m.to_host,
        )


def replaced(session: Session, action: Replace) -> None:
    """The old host is back from the project, the new one is the project's; a grant already
    recorded is not recorded twice (a repeated heal)."""
    h = action.handover
    slots = h.resource_type == INSTANCES  # resource ids "<host>:<slot>"
    if action.old_host is not None:
        old = f"{action.old_host}:*" if slots else action.old_host
        assignments.release_resource(session, h.reservation_id, h.resource_type, old, h.at)
    if action.new_host is not None:
        grants = [g for g in _grants(h) if g.resource_id.partition(":")[0] == action.new_host]
        assignments.assign_many(session, grants)
    LOG.info(
        "lease %s: reservation %s host %s replaced by %s",
        h.lease_id,
        h.reservation_id,
        action.old_host or "(none)",
        action.new_host or "(none)",
    )


def made(reservations: Iterable[Reservation], done: Done) -> None:
    """Record on each reservation the parameters the backend made for it."""
    for reservation in reservations:
        extra = done.params.get(reservation.id)
        if extra:
            reservation.params = {**reservation.params, **extra}
