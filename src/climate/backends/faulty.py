"""The faulty backend: the standalone backend behind a remote part that fails or hangs at random.

For tests and the stress harness (``backend = "faulty"``). Each call of a remote part draws one
number per item: below ``fault_rate`` the item fails, below ``fault_rate + fault_hang_rate`` the
whole call hangs (a cloud API that never answers; only the manager's timeout gets past it). A
retry draws again, so a retried call may succeed.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Self

from climate.backends.base import Handover, Outcome
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.errors import InvalidInput

HANG_SECONDS = 3600.0
"""How long a hanging call sleeps: for ever, as far as the manager is concerned."""


class InjectedFault(RuntimeError):
    """A failure the faulty backend made up."""


class FaultyBackend(StandaloneBackend):
    name = "faulty"

    def __init__(self, fault_rate: float, hang_rate: float = 0.0, seed: int = 0) -> None:
        for field, rate in (("fault_rate", fault_rate), ("fault_hang_rate", hang_rate)):
            if not 0.0 <= rate <= 1.0:
                raise InvalidInput(field, f"must lie between 0 and 1, not {rate}")
        if fault_rate + hang_rate > 1.0:
            raise InvalidInput("fault_hang_rate", "fault_rate + fault_hang_rate exceeds 1")
        self.fault_rate = fault_rate
        self.hang_rate = hang_rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # remote calls run in worker threads

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.fault_rate, settings.fault_hang_rate, settings.fault_seed)

    def start_remote(self, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        return self._call("start", len(items))

    def before_end_remote(self, items: Sequence[Sequence[tuple[Handover, str]]]) -> list[Outcome]:
        return self._call("before_end", len(items))

    def end_remote(self, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        return self._call("end", len(items))

    def start_manual_remote(self, handover: Handover) -> None:
        self._raise(self._call("start_manual", 1))

    def acknowledge_remote(self, handover: Handover) -> None:
        self._raise(self._call("acknowledge", 1))

    @staticmethod
    def _raise(outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome is not None:
                raise outcome

    def _call(self, what: str, count: int) -> list[Outcome]:
        with self._lock:
            draws = [self._random.random() for _ in range(count)]
        if any(self.fault_rate <= d < self.fault_rate + self.hang_rate for d in draws):
            threading.Event().wait(HANG_SECONDS)
        return [
            InjectedFault(f"injected {what} fault") if d < self.fault_rate else None for d in draws
        ]
