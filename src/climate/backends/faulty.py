"""The faulty backend: the standalone backend behind a cloud that fails or hangs at random.

For tests and the stress harness (``backend = "faulty"``). Each call draws one number per
action (enrolment of a resource always succeeds): below ``fault_rate`` the action fails, below
``fault_rate + fault_hang_rate`` the whole call hangs (a cloud API that never answers; only the
caller's timeout gets past it). A retry draws again, so a retried call may succeed.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Self

from climate.backends.base import ACTION_NAMES, Action, Enrol, Result, Withdraw
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
        self._lock = threading.Lock()  # calls run in worker threads

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(settings.fault_rate, settings.fault_hang_rate, settings.fault_seed)

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if all(isinstance(a, Enrol | Withdraw) for a in actions):
            return super().handle(actions)  # inventory is not what it puts under stress
        with self._lock:
            draws = [self._random.random() for _ in actions]
        if any(self.fault_rate <= d < self.fault_rate + self.hang_rate for d in draws):
            threading.Event().wait(HANG_SECONDS)
        results = super().handle(actions)
        for i, (action, draw) in enumerate(zip(actions, draws, strict=True)):
            if draw < self.fault_rate:
                results[i] = InjectedFault(f"injected {ACTION_NAMES[type(action)]} fault")
        return results
