"""The standalone backend: no cloud. Every action succeeds at once; the caller records who holds
what (db/assignments.py) and notifications go out. It cannot see whether a lease is in use: it
answers "unknown", and the consumer's heartbeats tell (docs/idle.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from climate.backends.base import (
    Action,
    Backend,
    Done,
    Enrol,
    Inspected,
    InspectUsage,
    Result,
    Usage,
)

LOG = logging.getLogger(__name__)


class StandaloneBackend(Backend):
    """Nothing to do in the world; an enrolled resource is whatever the request says it is."""

    name = "standalone"
    can_migrate = True

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results: list[Result] = []
        for action in actions:
            LOG.debug("standalone backend: %s", action)
            if isinstance(action, Enrol):
                results.append(Inspected())
            elif isinstance(action, InspectUsage):
                results.append(Usage({h.reservation_id: None for h in action.handovers}))
            else:
                results.append(Done())
        return results
