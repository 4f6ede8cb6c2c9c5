"""The event loop: claim due events, run them in order, sleep until the next one or a wake-up."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import uuid

from sqlalchemy.orm import Session

from climate.backends.base import Backend
from climate.db import leases as lease_rows
from climate.db.tables import Event, Lease
from climate.domain.status import EventStatus, check_event_transition
from climate.manager.handlers import EventHandlers, mark_in_progress
from climate.services.context import ServiceContext

LOG = logging.getLogger(__name__)
BATCH = 200
"""Events claimed and run per transaction: bounds how long a batch holds SQLite's write lock."""


class Manager:
    """Fires events at their time. Several managers may share one database; none fires an event
    twice: an event is claimed (IN_PROGRESS, claimed_by, claimed_until) before it runs, and its
    outcome is written only by the claim's holder. A claim left by a crashed manager expires and
    the event runs again; backend actions are idempotent so that rerun is safe.
    """

    def __init__(self, ctx: ServiceContext, backend: Backend, name: str | None = None) -> None:
        self.ctx = ctx
        self.handlers = EventHandlers(ctx, backend)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one pass ----------------------------------------------------------------------------

    def run_due(self) -> int:
        """Run every event due now; returns how many ran (successfully or not)."""
        done = 0
        while True:
            claimed = self._claim()
            if not claimed:
                return done
            for event_id, reason in self._execute(claimed):
                self._record_failure(event_id, reason)
            done += len(claimed)
            # Loop: running these may have made their leases' next events eligible.

    def _claim(self) -> list[str]:
        now = self.ctx.clock.now()
        until = now + dt.timedelta(seconds=self.ctx.settings.event_claim_seconds)
        with self.ctx.db.transaction() as session:
            due = lease_rows.due_events(session, now, BATCH)
            for event in due:
                if event.status == EventStatus.IN_PROGRESS:
                    LOG.warning(
                        "event %s of lease %s: claim of %s expired, taking it over",
                        event.id,
                        event.lease_id,
                        event.claimed_by,
                    )
            ids = [e.id for e in due]
            lease_rows.claim(session, ids, self.name, now, until)
        return ids

    def _execute(self, event_ids: list[str]) -> list[tuple[str, str]]:
        """Run claimed events in one transaction, each in a savepoint of its own, so that one
        failing event rolls back alone; returns (event id, reason) for each failure."""
        now = self.ctx.clock.now()
        failures: list[tuple[str, str]] = []
        with self.ctx.db.transaction() as session:
            for event in lease_rows.events_with_leases(session, event_ids):
                if not self._holds(event):
                    continue  # our claim expired and another manager took the event over
                try:
                    with session.begin_nested():
                        self._run(session, event, now)
                except Exception as exc:
                    LOG.exception("event %s of lease %s failed", event.id, event.lease_id)
                    failures.append((event.id, f"{type(exc).__name__}: {exc}"))
        return failures

    def _run(self, session: Session, event: Event, now: dt.datetime) -> None:
        lease = event.lease
        mark_in_progress(lease, event)
        self.handlers.run(session, lease, event, now)
        check_event_transition(event.status, EventStatus.DONE)
        event.status = EventStatus.DONE
        # When this event's work finished (the batch commits a few ms later), for lag figures.
        event.done_at = event.updated_at = self.ctx.clock.now()
        event.last_error = None
        LOG.info(
            "event %s (%s) of lease %s done, %.3f s after its time",
            event.id,
            event.event_type,
            lease.id,
            (now - event.time).total_seconds(),
        )

    def _holds(self, event: Event) -> bool:
        return event.status == EventStatus.IN_PROGRESS and event.claimed_by == self.name

    def _record_failure(self, event_id: str, reason: str) -> None:
        settings = self.ctx.settings
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            event = session.get(Event, event_id)
            if event is None or not self._holds(event):
                return
            lease = session.get(Lease, event.lease_id)
            assert lease is not None
            mark_in_progress(lease, event)  # a start being retried shows as STARTING
            event.last_error = reason
            event.updated_at = now
            event.claimed_by = event.claimed_until = None
            if event.attempts < settings.event_max_attempts:
                delay = settings.event_retry_base_seconds * 2 ** (event.attempts - 1)
                check_event_transition(event.status, EventStatus.UNDONE)
                event.status = EventStatus.UNDONE
                event.not_before = now + dt.timedelta(seconds=delay)
                LOG.warning(
                    "event %s of lease %s: attempt %d failed, retry in %.1f s: %s",
                    event.id,
                    lease.id,
                    event.attempts,
                    delay,
                    reason,
                )
            else:
                check_event_transition(event.status, EventStatus.ERROR)
                event.status = EventStatus.ERROR
                self.handlers.fail(
                    session,
                    lease,
                    f"{event.event_type} failed after {event.attempts} attempt(s): {reason}",
                    now,
                )
            lease_rows.signal_event_change(session)

    # -- the loop ----------------------------------------------------------------------------

    def seconds_until_next(self) -> float:
        with self.ctx.db.reader() as session:
            due = lease_rows.next_due(session)
        wait = self.ctx.settings.max_wait_seconds
        if due is not None:
            wait = min(wait, (due - self.ctx.clock.now()).total_seconds())
        return max(wait, 0.0)

    def wake(self) -> None:
        self._wake.set()

    def run_forever(self) -> None:
        LOG.info("manager %s started", self.name)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_due()
                wait = self.seconds_until_next()
            except Exception:
                LOG.exception("manager pass failed; retrying in 1 s")
                wait = 1.0
            self._wake.wait(wait)
        LOG.info("manager %s stopped", self.name)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run_forever, name="climate-manager", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
