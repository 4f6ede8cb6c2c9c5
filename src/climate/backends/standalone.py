"""The standalone backend: no cloud; it records who holds what (and notifications go out)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from climate.backends.base import Backend, Handover, Migration, Outcome
from climate.db import assignments
from climate.db import reclaim as reclaim_rows
from climate.db.assignments import State
from climate.domain.status import EndPolicy, StartPolicy

LOG = logging.getLogger(__name__)

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


class StandaloneBackend(Backend):
    """Its records are rows in the event's transaction, so a batch is two or three statements
    whatever its size (and a failure of one of them fails the batch, which the manager then
    retries one event at a time). An assignment's ``state`` says what a cloud backend would
    have done with the workload under the reservation's policies."""

    name = "standalone"

    def start(self, session: Session, handover: Handover) -> None:
        self.start_batch(session, [[handover]])

    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        LOG.debug("lease %s: before-end action %s", handover.lease_id, action)

    def end(self, session: Session, handover: Handover) -> None:
        self.end_batch(session, [[handover]])

    def start_manual(self, session: Session, handover: Handover) -> None:
        started = assignments.move_state(
            session, handover.reservation_id, State.HELD, State.RUNNING
        )
        LOG.info(
            "lease %s: reservation %s started by its project (%d resource(s))",
            handover.lease_id,
            handover.reservation_id,
            started,
        )

    def acknowledge(self, session: Session, handover: Handover) -> None:
        discarded = assignments.move_state(
            session, handover.reservation_id, State.KEPT, State.RELEASED
        )
        LOG.info(
            "lease %s: reservation %s acknowledged, %d kept resource(s) discarded",
            handover.lease_id,
            handover.reservation_id,
            discarded,
        )

    def start_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        handovers = [h for item in items for h in item]
        added = assignments.assign_many(session, [g for h in handovers for g in _grants(h)])
        for h in handovers:
            LOG.debug(
                "lease %s: %s %s handed to project %s (%s start)",
                h.lease_id,
                h.resource_type,
                ",".join(h.resource_ids),
                h.project_id,
                h.start_policy,
            )
        if handovers:
            LOG.info("%d reservation(s) started: %d resource(s) handed out", len(handovers), added)
        return [None] * len(items)

    def before_end_batch(
        self, session: Session, items: Sequence[Sequence[tuple[Handover, str]]]
    ) -> list[Outcome]:
        for item in items:
            for handover, action in item:
                self.before_end(session, handover, action)
        return [None] * len(items)

    def end_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        # One statement per (time, end policy): usually one.
        groups: dict[tuple[dt.datetime, EndPolicy], list[str]] = {}
        for item in items:
            for h in item:
                groups.setdefault((h.at, h.end_policy), []).append(h.reservation_id)
        released = 0
        for (at, policy), reservation_ids in groups.items():
            released += assignments.release_many(
                session, reservation_ids, at, end_policy=policy, state=ENDED[policy]
            )
        count = sum(len(ids) for ids in groups.values())
        if count:
            LOG.info("%d reservation(s) ended: %d resource(s) released", count, released)
        return [None] * len(items)

    can_migrate = True

    def migrate(self, session: Session, moves: Sequence[Migration]) -> None:
        """Record each move on the reservation's instance slots: those it has on the old host
        are released and as many are assigned on the new one (a reservation not started yet has
        none, so only its allocation moved)."""
        for m in moves:
            moved = reclaim_rows.reassign(
                session, m.reservation_id, m.from_host, m.to_host, m.count, m.at
            )
            LOG.info(
                "lease %s: %d instance(s) of reservation %s moved from host %s to host %s",
                m.lease_id,
                moved,
                m.reservation_id,
                m.from_host,
                m.to_host,
            )
