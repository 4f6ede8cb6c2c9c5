"""The standalone backend: no cloud. Every action succeeds at once; the caller records who holds
what (db/assignments.py) and notifications go out."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from climate.backends.base import Action, Backend, Done, Enrol, Inspected, Result

LOG = logging.getLogger(__name__)


class StandaloneBackend(Backend):
    """Nothing to do in the world; an enrolled resource is whatever the request says it is."""

    name = "standalone"
    can_migrate = True

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results: list[Result] = []
        for action in actions:
            LOG.debug("standalone backend: %s", action)
            results.append(Inspected() if isinstance(action, Enrol) else Done())
        return results
