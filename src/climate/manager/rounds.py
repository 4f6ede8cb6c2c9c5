"""Running a batch of due events: round by round, in segments of one event type, each segment
in a savepoint (``manager/service.py`` plans or claims the batch)."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from climate.backends.base import Outcome
from climate.db.leases import DueEvent
from climate.domain.status import EventType
from climate.manager.handlers import EventHandlers, Finish, Statuses, Step

LOG = logging.getLogger("climate.manager.service")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during a batch: a batch makes thousands of objects that
    live until it ends, and the full collections they trigger scan every object of the process
    (a large share of a batch's time). Collection resumes after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class Pass:
    """What running a batch did."""

    kinds: Counter[str]
    failures: list[tuple[str, str]]
    """(event id, reason) of each failed event."""
    unrun: list[str]
    """Events not run because an earlier event of their lease failed or was lost."""
    done: list[DueEvent] = field(default_factory=list)
    """The events that succeeded."""

    @property
    def ran(self) -> int:
        return sum(self.kinds.values())


def run_rounds(
    handlers: EventHandlers,
    session: Session,
    events: list[DueEvent],
    step_of: Callable[[DueEvent], Step | BaseException],
    finish: Finish,
    now: dt.datetime,
    lost: set[str] | None = None,
    statuses: Statuses | None = None,
) -> Pass:
    """Round by round (each lease's first event, then its next...), each round by segments
    of one event type in run order. A lease's later events run only if its earlier ones in
    this pass succeeded. ``step_of`` is asked just before a segment runs; ``statuses``, if
    given, learns each step that succeeded (the next rounds decide on it)."""
    lost = lost or set()
    result = Pass(Counter(), [], [])
    blocked: set[str] = set()
    rounds: dict[int, list[DueEvent]] = defaultdict(list)
    for event in events:
        rounds[event.round].append(event)
    for number in sorted(rounds):
        ready = []
        for event in sorted(rounds[number], key=lambda e: e.rank):
            if event.id in lost or event.lease_id in blocked:
                blocked.add(event.lease_id)
                if event.id not in lost:
                    result.unrun.append(event.id)
                continue
            ready.append(event)
        for kind, group in itertools.groupby(ready, key=lambda e: e.event_type):
            batch = list(group)
            steps = [step_of(e) for e in batch]
            outcomes = segment(handlers, session, EventType(kind), steps, now, finish)
            for event, step, outcome in zip(batch, steps, outcomes, strict=True):
                result.kinds[event.event_type] += 1
                if outcome is None:
                    result.done.append(event)
                    if statuses is not None and isinstance(step, Step):
                        statuses.record(step)
                    continue
                LOG.error(
                    "event %s (%s) of lease %s failed",
                    event.id,
                    event.event_type,
                    event.lease_id,
                    exc_info=outcome,
                )
                result.failures.append((event.id, f"{type(outcome).__name__}: {outcome}"))
                blocked.add(event.lease_id)
    return result


def segment(
    handlers: EventHandlers,
    session: Session,
    kind: EventType,
    steps: list[Step | BaseException],
    now: dt.datetime,
    finish: Finish,
) -> list[Outcome]:
    try:
        with session.begin_nested():
            return handlers.apply(session, kind, steps, now, finish)
    except Exception as exc:
        if len(steps) == 1:
            return [exc]
        LOG.exception(
            "%d %s events failed as a batch; applying them one at a time", len(steps), kind
        )
    outcomes: list[Outcome] = []
    for step in steps:
        outcomes.extend(segment(handlers, session, kind, [step], now, finish))
    return outcomes
