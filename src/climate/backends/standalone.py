"""The standalone backend: no cloud; it records who holds what (and notifications go out)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from climate.backends.base import Backend, Handover, Outcome
from climate.db import assignments

LOG = logging.getLogger(__name__)


def _grants(handover: Handover) -> list[assignments.Grant]:
    return [
        assignments.Grant(
            reservation_id=handover.reservation_id,
            lease_id=handover.lease_id,
            project_id=handover.project_id,
            resource_type=handover.resource_type,
            resource_id=resource_id,
            at=handover.at,
        )
        for resource_id in handover.resource_ids
    ]


class StandaloneBackend(Backend):
    """Its records are rows in the event's transaction, so a batch is two or three statements
    whatever its size (and a failure of one of them fails the batch, which the manager then
    retries one event at a time)."""

    name = "standalone"

    def start(self, session: Session, handover: Handover) -> None:
        self.start_batch(session, [[handover]])

    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        LOG.debug("lease %s: before-end action %s", handover.lease_id, action)

    def end(self, session: Session, handover: Handover) -> None:
        self.end_batch(session, [[handover]])

    def start_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        handovers = [h for item in items for h in item]
        added = assignments.assign_many(session, [g for h in handovers for g in _grants(h)])
        for h in handovers:
            LOG.debug(
                "lease %s: %s %s handed to project %s",
                h.lease_id,
                h.resource_type,
                ",".join(h.resource_ids),
                h.project_id,
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
        by_time: dict[dt.datetime, list[str]] = {}
        for item in items:
            for h in item:
                by_time.setdefault(h.at, []).append(h.reservation_id)
        released = 0
        for at, reservation_ids in by_time.items():
            released += assignments.release_many(session, reservation_ids, at)
        count = sum(len(ids) for ids in by_time.values())
        if count:
            LOG.info("%d reservation(s) ended: %d resource(s) released", count, released)
        return [None] * len(items)
