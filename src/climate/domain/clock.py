"""Time as a parameter: services and the manager ask a clock, never the system directly."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Protocol

UTC = dt.UTC


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start: dt.datetime) -> None:
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, delta: dt.timedelta) -> dt.datetime:
        with self._lock:
            self._now += delta
            return self._now

    def set(self, when: dt.datetime) -> None:
        with self._lock:
            self._now = when.astimezone(UTC)


def seconds_until(due: dt.datetime | None, now: dt.datetime, longest: float) -> float:
    """How long to sleep for something due at ``due``: never negative, at most ``longest``."""
    wait = longest if due is None else min(longest, (due - now).total_seconds())
    return max(wait, 0.0)
