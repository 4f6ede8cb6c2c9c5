"""The standalone backend: no cloud; it records who holds what (and notifications go out)."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from climate.backends.base import Backend, Handover
from climate.db import assignments

LOG = logging.getLogger(__name__)


class StandaloneBackend(Backend):
    name = "standalone"

    def start(self, session: Session, handover: Handover) -> None:
        for resource_id in handover.resource_ids:
            assignments.assign(
                session,
                reservation_id=handover.reservation_id,
                lease_id=handover.lease_id,
                project_id=handover.project_id,
                resource_type=handover.resource_type,
                resource_id=resource_id,
                now=handover.at,
            )
        LOG.info(
            "lease %s: %s %s handed to project %s",
            handover.lease_id,
            handover.resource_type,
            ",".join(handover.resource_ids),
            handover.project_id,
        )

    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        LOG.info("lease %s: before-end action %s", handover.lease_id, action)

    def end(self, session: Session, handover: Handover) -> None:
        released = assignments.release(session, handover.reservation_id, handover.at)
        LOG.info("lease %s: %d resource(s) released", handover.lease_id, released)
