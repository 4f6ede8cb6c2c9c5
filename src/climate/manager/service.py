"""The event loop: run due events in batches at their time, sleep until the next one.

Two ways to run events, both batched (one transaction, segments of one event type whose backend
work is one call and whose writes are a few statements):

- *planned*: a little before the next due instant the manager reads what will be due then (the
  events, their leases, what each event will do) and at the instant only checks that nothing
  changed and writes. This is what makes a thousand simultaneous starts take tens of ms.
- *claimed*: anything else due (a plan that went stale, events of a lease another manager was
  running, claims that expired) is claimed in one transaction and run in the next, as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from functools import partial

from climate import metrics
from climate.backends.base import Backend, Timeboxed
from climate.context import ServiceContext
from climate.db import events as event_rows
from climate.db import leases as lease_rows
from climate.db import managers, ops
from climate.db.leases import DueEvent
from climate.db.tables import Event, Lease
from climate.domain.clock import seconds_until
from climate.domain.status import EventStatus, EventType, check_event_transition
from climate.manager.handlers import (
    EventHandlers,
    Statuses,
    Step,
    ends_early,
    mark_in_progress,
)
from climate.manager.periodic import Every
from climate.manager.rounds import Pass, gc_paused, run_rounds
from climate.services.healing import HealingService
from climate.services.idle import IdleService
from climate.services.leases import LeaseService
from climate.services.power import PowerService
from climate.services.reclaim import ReclaimService

LOG = logging.getLogger(__name__)
BATCH = 1000
"""Leases whose events are run per transaction (each brings the events due with it, so up to
three times as many events): bounds how long a pass holds SQLite's write lock."""
PREPARE_SECONDS = 1.0
"""How long before the next due instant the manager plans it, at least (three times as long as
the last plan took, if that is more, up to ``MAX_LEAD_SECONDS``). Nothing runs before its time."""
MAX_LEAD_SECONDS = 10.0
PLAN_LEASES = 5 * BATCH
"""At most this many leases are planned; the rest of an instant is claimed and run after."""
STORAGE_BACKOFF_SECONDS = 8.0
"""The longest wait between passes while the database cannot store anything (disk full,
read-only): the events due meanwhile run at most this long after it can again."""


@dataclass
class _Plan:
    """The events due at ``due`` with what each will do, worked out ahead of time.

    It holds at ``due`` if the admission lock's version is unchanged (every API change to
    leases, events, reservations, allocations or hosts bumps it) and every planned event is
    still waiting: then no manager touched these leases either, since a manager changes a lease
    only by running one of its events, and all of those that were pending are in the plan.
    """

    due: dt.datetime
    version: int
    events: list[DueEvent]
    steps: dict[str, Step | BaseException]
    leases: int


def _observe_lag(done: list[DueEvent], times: dict[str, dt.datetime], now: dt.datetime) -> None:
    """How long after its time each event was done (``climate_event_lag_seconds``)."""
    for event in done:
        at = times.get(event.id)
        if at is not None:
            metrics.EVENT_LAG.labels(event.event_type).observe(max(0.0, (now - at).total_seconds()))


NOTHING_DUE = dt.datetime.max.replace(tzinfo=dt.UTC)


class Manager:
    """Fires events at their time. Several managers may share one database; none fires an event
    twice: an event is taken (claimed, or locked and verified in the planned path) before it
    runs, and its outcome is written only by the manager that took it. A claim left by a crashed
    manager is taken over once its heartbeat stops (or its claim expires, for a manager without
    one: ``manager/liveness.py``) and the event runs again; backend actions are idempotent so
    that rerun is safe.

    A failing event changes nothing and the others of its batch stand; should a segment fail as
    a whole, it is rolled back to its savepoint and applied again one event per savepoint.
    """

    def __init__(self, ctx: ServiceContext, backend: Backend, name: str | None = None) -> None:
        self.ctx = ctx
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.handlers = EventHandlers(
            ctx, Timeboxed(backend, ctx.settings.backend_timeout_seconds), self.name
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._plan: _Plan | None = None
        self._lead = PREPARE_SECONDS
        self._prepare_seconds = 0.0
        self._expecting: dt.datetime | None = None
        """The earliest waiting event at the last read of the queue (None: not known)."""
        self._queue_version: int | None = None
        """The admission version when the waiting queue was last served."""
        self._freed = False
        """Leases ended since the queue was last served."""
        self._next_heal = 0.0
        """When (monotonic) to look for reservations to heal next (services/healing.py)."""
        power, idle = (
            PowerService(ctx, self.handlers.backend),
            IdleService(ctx, self.handlers.backend),
        )
        self.power = Every(ctx.settings.power_interval_seconds, power.run)
        """Power idle hosts down, wake those whose lease comes near (services/power.py)."""
        self.idle = Every(ctx.settings.idle_interval_seconds, idle.run)
        """Warn and release leases nobody uses (services/idle.py, ``idle_reclaim``)."""
        self._healing = False
        """Hosts are down or leases degraded: the manager looks again every heal period."""

    @property
    def _with_events(self) -> bool:
        """Notifications show the lease's events: load them only when there are sinks."""
        return bool(self.ctx.settings.notification_sinks)

    # -- one pass ----------------------------------------------------------------------------

    def run_due(self) -> int:
        """Run every event due now; returns how many ran (successfully or not)."""
        done = 0
        plan = self._plan
        if plan is not None and plan.due <= self.ctx.clock.now():
            self._plan = None
            with gc_paused():
                result = self._run_plan(plan)
            self._record_failures(result)
            self._freed = self._freed or bool(result.kinds[EventType.END_LEASE])
            done += result.ran
        while True:
            with gc_paused():
                claimed = self._claim()
                if not claimed:
                    return done
                result = self._execute(claimed)
            self._record_failures(result)
            self._freed = self._freed or bool(result.kinds[EventType.END_LEASE])
            done += result.ran
            if not result.ran:
                return done  # every claim was lost to another manager: nothing left for us
            # Loop: failures may have made events due again, or the batch was full.

    def _record_failures(self, result: Pass) -> None:
        for event_id, reason in result.failures:
            self._record_failure(event_id, reason)

    # -- planned -----------------------------------------------------------------------------

    def prepare(self) -> int:
        """Plan the next due instant (or now, if events are overdue): read the events due by
        then and their leases and decide what each event will do, writing nothing. Returns how
        many events are planned."""
        with gc_paused(), self.ctx.db.reader() as session:
            due = event_rows.next_due(session)
            if due is None:
                self._plan = None
                return 0
            due = max(due, self.ctx.clock.now())  # behind: everything due by now
            # The version first: a change committed after it shows as a new version at ``due``.
            version = lease_rows.admission_version(session)
            events = event_rows.chains_due_by(session, due, PLAN_LEASES)
            leases = event_rows.leases_for_events(
                session, {e.lease_id for e in events}, with_events=self._with_events
            )
            # An early end releases through the resource type, which wants the lease in the
            # transaction: those are left to the claimed path.
            early = {
                e.lease_id
                for e in events
                if e.event_type == EventType.END_LEASE and ends_early(leases[e.lease_id], due)
            }
            events = [e for e in events if e.lease_id not in early]
            statuses = Statuses()
            steps: dict[str, Step | BaseException] = {}
            reminders = lease_rows.reminder_ids(session, events)
            for event in sorted(events, key=lambda e: (e.round, e.rank)):
                try:
                    step = self.handlers.decide(
                        EventType(event.event_type),
                        event.id,
                        leases[event.lease_id],
                        statuses,
                        due,
                        reminder=event.id in reminders,
                    )
                except Exception as exc:
                    steps[event.id] = exc
                else:
                    statuses.record(step)
                    steps[event.id] = step
        self._plan = _Plan(due, version, events, steps, len(leases) - len(early))
        return len(events)

    def _run_plan(self, plan: _Plan) -> Pass:
        """Run a plan in one transaction, if it still holds; otherwise leave its events to the
        claimed path."""
        now = self.ctx.clock.now()
        until = now + dt.timedelta(seconds=self.ctx.settings.event_claim_seconds)
        ids = [e.id for e in plan.events]
        result = Pass(Counter(), [], [])
        if not ids:
            return result
        began = time.perf_counter()
        with self.ctx.db.transaction() as session:
            if lease_rows.admission_version(session) != plan.version:
                LOG.info("plan for %s: leases changed since; claiming its events", plan.due)
                return result
            if event_rows.take_waiting(session, ids, now) != len(ids):
                LOG.info("plan for %s: events taken meanwhile; claiming them", plan.due)
                return result
            finish = partial(event_rows.finish_events, taken_by=self.name, until=until)
            result = run_rounds(
                self.handlers, session, plan.events, lambda e: plan.steps[e.id], finish, now
            )
            _observe_lag(result.done, dict.fromkeys((e.id for e in result.done), plan.due), now)
            # Failed events are claimed like any other, so that their failure is recorded.
            failed = [event_id for event_id, _ in result.failures]
            lease_rows.claim(session, failed, self.name, now, until)
        self._log(result, plan.leases, began, "planned")
        return result

    # -- claimed -----------------------------------------------------------------------------

    def _claim(self) -> list[DueEvent]:
        settings = self.ctx.settings
        now = self.ctx.clock.now()
        until = now + dt.timedelta(seconds=settings.event_claim_seconds)
        alive_since = managers.wall_now() - dt.timedelta(seconds=settings.manager_dead_seconds)
        with self.ctx.db.transaction() as session:
            due = lease_rows.due_events(session, now, BATCH, alive_since=alive_since)
            gone = event_rows.claim_holders(
                session, [e.id for e in due if e.status == EventStatus.IN_PROGRESS]
            )
            heads = {e.id for e in due if e.round == 0}
            lease_rows.claim(session, [e.id for e in due], self.name, now, until)
        for event_id, (holder, attempts) in gone.items():
            LOG.warning(
                "event %s: manager %s stopped during attempt %d (its claim expired or its "
                "heartbeat stopped); taking it over",
                event_id,
                holder,
                attempts,
            )
            # The lost attempt counts: an event that kills its manager must not kill every
            # manager in turn, for ever. Its lease's later events were only claimed with it.
            if event_id in heads and attempts >= settings.event_max_attempts:
                self._record_failure(
                    event_id, f"manager {holder} stopped during attempt {attempts} of the event"
                )
        return due

    def _execute(self, due: list[DueEvent]) -> Pass:
        """Run claimed events in one transaction (those we still hold)."""
        began = time.perf_counter()
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            lost = event_rows.lost_claims(session, [e.id for e in due], self.name)
            leases = event_rows.leases_for_events(
                session, {e.lease_id for e in due}, with_events=self._with_events
            )
            statuses = Statuses()
            reminders = lease_rows.reminder_ids(session, due)

            def decide(event: DueEvent) -> Step | BaseException:
                try:
                    return self.handlers.decide(
                        EventType(event.event_type),
                        event.id,
                        leases[event.lease_id],
                        statuses,
                        now,
                        reminder=event.id in reminders,
                    )
                except Exception as exc:
                    return exc

            result = run_rounds(
                self.handlers, session, due, decide, event_rows.finish_events, now, lost, statuses
            )
            event_rows.unclaim(session, result.unrun, self.name, now)
            times = ops.event_times(session, [e.id for e in result.done])
        _observe_lag(result.done, times, now)
        self._log(result, len(leases), began, "claimed")
        return result

    # -- both --------------------------------------------------------------------------------

    def _log(self, result: Pass, leases: int, began: float, how: str) -> None:
        if not result.ran:
            return
        LOG.info(
            "%d event(s) of %d lease(s) done in %.0f ms (%s), %d failed (%s)%s",
            result.ran,
            leases,
            (time.perf_counter() - began) * 1000.0,
            how,
            len(result.failures),
            ", ".join(f"{n} {k}" for k, n in sorted(result.kinds.items())),
            f"; {len(result.unrun)} left for later after an earlier failure"
            if result.unrun
            else "",
        )

    def _record_failure(self, event_id: str, reason: str) -> None:
        settings = self.ctx.settings
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            event = session.get(Event, event_id, with_for_update=True)
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
            retry_at = event.not_before if event.status == EventStatus.UNDONE else now
            lease_rows.signal_event_change(session, retry_at)

    def _holds(self, event: Event) -> bool:
        return event.status == EventStatus.IN_PROGRESS and event.claimed_by == self.name

    # -- the waiting queue -------------------------------------------------------------------

    def serve_queue(self) -> int:
        """Serve the waiting queue (``LeaseService.serve_queue``) if capacity may have freed
        since it was last served (the admission version moved: a delete, a shrink, a host
        added; or a lease ended here) or one of its timers is due. Returns how many leases
        were admitted."""
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            version = lease_rows.admission_version(session)
            due, _ = lease_rows.queue_timers(session)
        changed = self._freed or version != self._queue_version
        if not changed and (due is None or due > now):
            return 0
        # Taken before serving: the queue's own admissions move the version and make the next
        # call look once more, which admits nothing new unless something else freed meanwhile.
        self._queue_version, self._freed = version, False
        admitted = LeaseService(self.ctx).serve_queue(capacity_changed=changed)
        if changed:  # hosts best-effort leases may reclaim (services/reclaim.py)
            admitted += ReclaimService(self.ctx, self.handlers.backend).serve_queue()
        return admitted

    # -- healing -----------------------------------------------------------------------------

    def heal(self) -> None:
        """Now and then (``queue_poll_seconds``) heal reservations that came into the heal
        horizon on a down host and fill degraded leases from hosts steady again; the API heals
        the rest the moment a host goes down."""
        if time.monotonic() < self._next_heal:
            return
        self._next_heal = time.monotonic() + self.ctx.settings.queue_poll_seconds
        self._healing = HealingService(self.ctx, self.handlers.backend).heal_due()

    # -- the loop ----------------------------------------------------------------------------

    def seconds_until_next(self) -> float:
        self._expecting = None  # while reading, every wake-up counts
        settings = self.ctx.settings
        with self.ctx.db.reader() as session:
            due = event_rows.next_due(session)
            queue_due, hunting = lease_rows.queue_timers(session)
            beat = managers.oldest_claimer_beat(session)
        if beat is not None:
            # When that manager's claims become takeable should it not beat again, on the
            # service clock (heartbeats are wall-clock time).
            silent = (
                beat - managers.wall_now() + dt.timedelta(seconds=settings.manager_dead_seconds)
            )
            takeover = self.ctx.clock.now() + silent
            due = takeover if due is None else min(due, takeover)
        if queue_due is not None:
            due = queue_due if due is None else min(due, queue_due)
        self._expecting = NOTHING_DUE if due is None else due
        # Best-effort leases also look now and then for capacity freed without a wake-up.
        waiting = hunting or self._healing
        most = min(settings.max_wait_seconds, settings.queue_poll_seconds) if waiting else None
        return seconds_until(due, self.ctx.clock.now(), most or settings.max_wait_seconds)

    def _sleep_or_prepare(self) -> float:
        """Seconds to sleep: until the next event is due, or until it is time to plan it.
        Within the lead time of it, plans it first (again if the plan went stale and there is
        time to)."""
        wait = self.seconds_until_next()
        if wait <= 0.0:
            return 0.0
        if wait > self._lead:
            return wait - self._lead
        plan = self._plan
        if plan is not None and self._plan_current(plan):
            return wait
        if plan is not None and wait < self._prepare_seconds * 2:
            return wait  # no time to plan again: the stale plan gives way to claiming at once
        began = time.perf_counter()
        try:
            count = self.prepare()
        except Exception:
            LOG.exception("planning the next events failed; they will be claimed when due")
            self._plan = None
            return self.seconds_until_next()
        took = time.perf_counter() - began
        # Plan the next instants early enough for plans this size.
        self._prepare_seconds = took
        self._lead = min(max(PREPARE_SECONDS, 3.0 * took), MAX_LEAD_SECONDS)
        LOG.debug("planned %d event(s) in %.0f ms", count, took * 1e3)
        return self.seconds_until_next()

    def _plan_current(self, plan: _Plan) -> bool:
        with self.ctx.db.reader() as session:
            return (
                event_rows.next_due(session) == plan.due
                and lease_rows.admission_version(session) == plan.version
            )

    def wake(self, earliest: dt.datetime | None = None) -> None:
        """Look for due events now; with ``earliest`` (the first event that changed), only if
        that is before the event the manager is already waiting for.

        Skipping is safe: ``_expecting`` is set only after a read of the queue, and the manager
        reads it again by that time at the latest; it is None while a read is under way.
        """
        expecting = self._expecting
        if earliest is None or expecting is None or earliest < expecting:
            self._wake.set()

    def _give_back_claims(self) -> None:
        """After a pass failed midway (its database connection lost, say), the events it had
        claimed and not finished are still ours: nobody else takes a live manager's claims, so
        they would wait for the claim to run out (``event_claim_seconds``, 120 s), their leases
        not started or not ended meanwhile. Give them back, waiting again, the failed pass not
        counted as an attempt, so that this pass runs them."""
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            held = event_rows.claimed_by(session, self.name)
            event_rows.unclaim(session, held, self.name, now)
        if held:
            LOG.warning("%d event(s) claimed by the failed pass are waiting again", len(held))

    def run_forever(self) -> None:
        LOG.info("manager %s started", self.name)
        failed = False
        stuck = 0  # passes failed in a row on a full disk or a read-only database
        while not self._stop.is_set():
            self._wake.clear()
            try:
                if failed:
                    self._give_back_claims()
                    failed = False
                self.run_due()
                self.heal()
                until_power = self.power()
                until_idle = self.idle() if self.ctx.settings.idle_reclaim else float("inf")
                wait = 0.0 if self.serve_queue() else self._sleep_or_prepare()
                if self.ctx.settings.power_policy == "act":
                    wait = min(wait, until_power)
                wait = min(wait, until_idle)
            except Exception as exc:
                failed = True
                wait = 1.0
                if (problem := self.ctx.db.storage_problem(exc)) is not None:
                    # Lasts until an operator acts; the events stay due and run once it is over.
                    stuck += 1
                    wait = min(2.0 ** (stuck - 1), STORAGE_BACKOFF_SECONDS)
                    LOG.error("manager pass failed: %s; retrying in %.0f s", problem, wait)
                else:
                    LOG.exception("manager pass failed; retrying in 1 s")
            else:
                stuck = 0
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
