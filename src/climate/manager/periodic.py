"""Passes the manager runs now and then from its loop, whatever events are due: the power
policy (services/power.py) and idle reclamation (services/idle.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Every:
    """``work`` at most once every ``seconds`` (monotonic time); the first call runs it."""

    def __init__(self, seconds: float, work: Callable[[], object]) -> None:
        self.seconds = seconds
        self.work = work
        self._next = 0.0

    def __call__(self) -> float:
        """Run the work if it is due; the seconds until it is due again."""
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.seconds
            self.work()
        return max(self._next - time.monotonic(), 0.0)
