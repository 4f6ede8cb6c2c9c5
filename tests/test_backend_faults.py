"""Backend faults: calls that fail or hang are retried with backoff, then the event and the lease
go to ERROR with the reason; a hung call is abandoned after ``backend_timeout_seconds`` and can
never write into the manager's transaction afterwards."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence

import pytest
from sqlalchemy import select

from climate.backends import load_backend
from climate.backends.base import Action, Result, Start
from climate.backends.faulty import FaultyBackend
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.db.engine import Database
from climate.db.tables import Assignment, Lease
from climate.domain.clock import ManualClock
from climate.errors import InvalidInput
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)


def _context(
    settings: Settings, db: Database, clock: ManualClock, **changes: object
) -> ServiceContext:
    return build_context(settings.model_copy(update=changes), db, clock)


def _start_event(leases: LeaseService, lease_id: str) -> tuple[str, int, str | None]:
    start = next(e for e in leases.get(ALICE, lease_id).events if e.event_type == "start_lease")
    return start.status, start.attempts, start.last_error


def _assignments(ctx: ServiceContext) -> int:
    with ctx.db.reader() as session:
        return len(session.scalars(select(Assignment)).all())


def test_faulty_backend_is_an_installed_plugin_built_from_the_settings(settings: Settings) -> None:
    backend = load_backend(
        settings.model_copy(update={"backend": "faulty", "fault_rate": 0.25, "fault_seed": 7})
    )
    assert isinstance(backend, FaultyBackend)
    assert (backend.fault_rate, backend.hang_rate) == (0.25, 0.0)
    with pytest.raises(InvalidInput, match="fault_rate: must lie between 0 and 1"):
        load_backend(settings.model_copy(update={"backend": "faulty", "fault_rate": 1.5}))


def test_backend_failing_every_call_puts_event_and_lease_in_error_with_the_reason(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = _context(settings, db, clock, backend="faulty", fault_rate=1.0)
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    Manager(ctx, load_backend(ctx.settings)).run_due()  # no backoff here: all attempts at once
    shown = leases.get(ALICE, lease.id)
    assert shown.status == "ERROR"
    assert shown.status_reason == (
        "start_lease failed after 3 attempt(s): InjectedFault: injected start fault"
    )
    assert _start_event(leases, lease.id) == (
        "ERROR",
        3,
        "InjectedFault: injected start fault",
    )
    assert _assignments(ctx) == 0


def test_random_faults_are_drawn_per_call_so_retries_get_through(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = _context(settings, db, clock, event_max_attempts=20)
    add_hosts(HostService(ctx), 20)
    leases = LeaseService(ctx)
    made = [leases.create(ALICE, host_request(f"l{i}", T0, T0 + HOUR)) for i in range(20)]
    Manager(ctx, FaultyBackend(fault_rate=0.5, seed=3)).run_due()
    starts = [_start_event(leases, lease.id) for lease in made]
    assert {leases.get(ALICE, lease.id).status for lease in made} == {"ACTIVE"}
    assert {status for status, _, _ in starts} == {"DONE"}
    assert max(attempts for _, attempts, _ in starts) > 1  # some failed first, then got through
    assert _assignments(ctx) == 20  # each handed out once, however many attempts it took


def test_hung_call_is_abandoned_after_the_timeout_and_retried_until_error(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = _context(settings, db, clock, backend_timeout_seconds=0.2, event_retry_base_seconds=5.0)
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    manager = Manager(ctx, FaultyBackend(fault_rate=0.0, hang_rate=1.0))
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))

    began = time.monotonic()
    assert manager.run_due() == 1
    assert 0.2 <= time.monotonic() - began < 5.0
    reason = "BackendTimeout: backend start timed out after 0.2 s"
    assert _start_event(leases, lease.id) == ("UNDONE", 1, reason)
    assert leases.get(ALICE, lease.id).status == "STARTING"

    clock.advance(dt.timedelta(seconds=5))  # the first retry, after the backoff
    manager.run_due()
    clock.advance(dt.timedelta(seconds=10))
    manager.run_due()
    shown = leases.get(ALICE, lease.id)
    assert shown.status == "ERROR"
    assert shown.status_reason == f"start_lease failed after 3 attempt(s): {reason}"
    assert _assignments(ctx) == 0


class SlowOnce(StandaloneBackend):
    """A cloud that answers the first start late (after the manager gave up), then at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0
        self.late_answer = threading.Event()

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if isinstance(actions[0], Start):
            self.calls += 1
            if self.calls == 1:
                time.sleep(self.delay)
                self.late_answer.set()
        return super().handle(actions)


def test_an_abandoned_call_that_answers_late_writes_nothing(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = _context(settings, db, clock, backend_timeout_seconds=0.1, event_retry_base_seconds=5.0)
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    backend = SlowOnce(delay=0.5)
    manager = Manager(ctx, backend)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))

    manager.run_due()
    assert backend.late_answer.wait(5)  # the abandoned call has now returned: success, too late
    time.sleep(0.05)
    assert _start_event(leases, lease.id)[:2] == ("UNDONE", 1)
    assert _assignments(ctx) == 0  # its record part never ran

    clock.advance(dt.timedelta(seconds=5))
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    assert _start_event(leases, lease.id) == ("DONE", 2, None)
    assert _assignments(ctx) == 1


def test_deleting_a_lease_while_a_manager_runs_its_start_still_ends_it(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """Found by the stress harness: the delete saw a PENDING lease and dropped its end event,
    then the manager finished the start: an ACTIVE lease with no end, for ever."""
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    manager = Manager(ctx, StandaloneBackend())
    claimed = manager._claim()  # the start is taken; the lease still shows PENDING
    leases.delete(ALICE, lease.id)
    manager._execute(claimed)
    clock.advance(dt.timedelta(seconds=1))
    manager.run_due()  # the end, moved to the deletion time, follows the start
    with ctx.db.reader() as session:
        shown = session.get(Lease, lease.id)
        assert shown is not None
        assert shown.status == "TERMINATED"
        events = {e.event_type: e.status for e in shown.events}
        assert (events["start_lease"], events["end_lease"]) == ("DONE", "DONE")


def test_deleting_a_lease_whose_end_gave_up_tries_the_end_again(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    """Found by the stress harness: a lease whose end failed every attempt (ERROR) was deleted,
    went DELETING, and no event would ever end it."""
    ctx = _context(settings, db, clock)
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    Manager(ctx, StandaloneBackend()).run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    clock.advance(HOUR)
    failing = _context(settings, db, clock, backend="faulty", fault_rate=1.0)
    Manager(failing, load_backend(failing.settings)).run_due()
    ended = {e.event_type: (e.status, e.attempts) for e in leases.get(ALICE, lease.id).events}
    assert leases.get(ALICE, lease.id).status == "ERROR"
    assert ended["end_lease"] == ("ERROR", 3)

    leases.delete(ALICE, lease.id)
    with ctx.db.reader() as session:
        deleting = session.get(Lease, lease.id)
        assert deleting is not None and deleting.status == "DELETING"
        end = next(e for e in deleting.events if e.event_type == "end_lease")
        assert (end.status, end.attempts, end.not_before) == ("UNDONE", 0, clock.now())
    Manager(ctx, StandaloneBackend()).run_due()
    with ctx.db.reader() as session:
        shown = session.get(Lease, lease.id)
        assert shown is not None and shown.status == "TERMINATED"
        assert {e.event_type: e.status for e in shown.events}["end_lease"] == "DONE"
        assert {r.status for r in shown.reservations} == {"deleted"}
