"""A lease from creation to its end, driven by the manager on a manual clock."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

import pytest
from sqlalchemy import select

from climate.backends.base import Action, Backend, Done, Result, Start
from climate.db.tables import Assignment, Lease, OutboxMessage
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.manager.service import Manager
from climate.runtime import build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request, hosts_of

HOUR = dt.timedelta(hours=1)


def test_lease_goes_pending_active_terminated_on_time(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 2)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l1", T0 + HOUR, T0 + 3 * HOUR))
    assert lease.status == "PENDING"
    assert len(hosts_of(lease)) == 1

    assert manager.run_due() == 0
    # Sleeps until the start, at most max_wait_seconds at a time.
    assert manager.seconds_until_next() == ctx.settings.max_wait_seconds
    clock.set(T0 + HOUR - dt.timedelta(seconds=5))
    assert manager.seconds_until_next() == pytest.approx(5)

    clock.set(T0 + HOUR)
    assert manager.run_due() == 1
    lease = leases.get(ALICE, lease.id)
    assert lease.status == "ACTIVE"
    assert [r.status for r in lease.reservations] == ["active"]

    clock.set(T0 + 2 * HOUR)  # default before-end: one hour before the end
    assert manager.run_due() == 1
    clock.set(T0 + 3 * HOUR)
    assert manager.run_due() == 1
    lease = leases.get(ALICE, lease.id)
    assert lease.status == "TERMINATED"
    assert [e.status for e in lease.events] == ["DONE", "DONE", "DONE"]
    assert [r.status for r in lease.reservations] == ["deleted"]


def test_standalone_backend_records_handover_and_release(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    manager.run_due()
    with ctx.db.reader() as session:
        (record,) = session.scalars(select(Assignment)).all()
        assert (record.project_id, record.released_at) == ("project-a", None)
    clock.set(T0 + HOUR)
    manager.run_due()
    with ctx.db.reader() as session:
        (record,) = session.scalars(select(Assignment)).all()
        assert record.lease_id == lease.id
        assert record.released_at == T0 + HOUR


def test_ended_lease_frees_its_hosts_for_the_next_window(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    leases.create(ALICE, host_request("first", T0, T0 + HOUR))
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, host_request("overlap", T0 + HOUR / 2, T0 + 2 * HOUR))
    follow = leases.create(ALICE, host_request("next", T0 + HOUR, T0 + 2 * HOUR))
    assert follow.status == "PENDING"


def test_every_transition_is_notified_through_the_outbox(settings, db, clock: ManualClock) -> None:

    from climate.runtime import build_context

    ctx = build_context(
        settings.model_copy(update={"webhooks": ("http://127.0.0.1:9/hook",)}), db, clock
    )
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l1", T0, T0 + 2 * HOUR))
    manager.run_due()
    leases.update(ALICE, lease.id, LeaseChanges(name="renamed"))
    clock.set(T0 + 2 * HOUR)
    manager.run_due()
    leases.delete(ALICE, lease.id)
    with db.reader() as session:
        topics = [
            m.topic for m in session.scalars(select(OutboxMessage).order_by(OutboxMessage.id))
        ]
    assert topics == [
        "lease.create",
        "lease.start",
        "lease.update",
        "lease.before_end",
        "lease.end",
        "lease.delete",
    ]


class FlakyBackend(Backend):
    """Fails its first ``failures`` starts."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results: list[Result] = []
        for action in actions:
            self.calls += isinstance(action, Start)
            failing = isinstance(action, Start) and self.calls <= self.failures
            results.append(RuntimeError("cloud said no") if failing else Done())
        return results


def test_failed_start_is_retried_after_backoff_then_succeeds(
    settings, db, clock: ManualClock
) -> None:

    from climate.runtime import build_context

    ctx = build_context(settings.model_copy(update={"event_retry_base_seconds": 10}), db, clock)
    add_hosts(HostService(ctx), 1)
    leases = LeaseService(ctx)
    backend = FlakyBackend(failures=1)
    manager = Manager(ctx, backend)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    manager.run_due()
    shown = leases.get(ALICE, lease.id)
    assert shown.status == "STARTING"
    start = next(e for e in shown.events if e.event_type == "start_lease")
    assert (start.status, start.attempts, start.last_error) == (
        "UNDONE",
        1,
        "RuntimeError: cloud said no",
    )
    assert start.not_before == T0 + dt.timedelta(seconds=10)
    assert manager.run_due() == 0  # not before the backoff
    clock.advance(dt.timedelta(seconds=10))
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    assert backend.calls == 2


def test_start_failing_every_attempt_puts_lease_in_error_with_reason(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = Manager(ctx, FlakyBackend(failures=100))
    lease = leases.create(ALICE, host_request("l1", T0, T0 + HOUR))
    for _ in range(ctx.settings.event_max_attempts):
        manager.run_due()
    shown = leases.get(ALICE, lease.id)
    assert shown.status == "ERROR"
    assert "start_lease failed after 3 attempt(s): RuntimeError: cloud said no" in (
        shown.status_reason or ""
    )
    assert [r.status for r in shown.reservations] == ["error"]
    # The end still comes and takes whatever was handed out back.
    clock.set(T0 + HOUR)
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "TERMINATED"


def test_event_due_while_manager_was_down_runs_once_at_start_up(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l1", T0 + HOUR, T0 + 5 * HOUR))
    clock.set(T0 + 2 * HOUR)  # nobody was running at the start time
    first, second = build_workers(ctx).manager, build_workers(ctx).manager
    assert first.run_due() == 1
    assert second.run_due() == 0
    assert leases.get(ALICE, lease.id).status == "ACTIVE"


def test_claim_of_a_crashed_manager_expires_and_another_finishes_the_event(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + 5 * HOUR))
    crashed = build_workers(ctx).manager
    assert crashed._claim()  # claimed, then the process died before running it
    survivor = build_workers(ctx).manager
    assert survivor.run_due() == 0
    clock.advance(dt.timedelta(seconds=ctx.settings.event_claim_seconds + 1))
    assert survivor.run_due() == 1
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    with ctx.db.reader() as session:
        assert len(session.scalars(select(Assignment)).all()) == 1


def _stored_status(ctx: ServiceContext, lease_id: str) -> str:
    with ctx.db.reader() as session:
        return str(session.get(Lease, lease_id).status)  # type: ignore[union-attr]


def test_a_deleted_running_lease_is_deleting_until_the_manager_has_ended_it(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """As Blazar's ``delete_lease``: DELETING while the resources are taken back (the API no
    longer shows the lease), the ``lease.delete`` notification saying so; then TERMINATED.
    A lease that had not started is TERMINATED at once."""
    hooked = ctx.settings.model_copy(update={"webhooks": ("http://127.0.0.1:9/",)})
    ctx = dataclasses.replace(ctx, settings=hooked)
    add_hosts(hosts, 2)
    leases = LeaseService(ctx)
    manager = build_workers(ctx).manager
    running = leases.create(ALICE, host_request("running", T0, T0 + 3 * HOUR))
    later = leases.create(ALICE, host_request("later", T0 + HOUR, T0 + 3 * HOUR))
    manager.run_due()
    clock.set(T0 + dt.timedelta(minutes=5))
    leases.delete(ALICE, running.id)
    leases.delete(ALICE, later.id)
    assert _stored_status(ctx, running.id) == "DELETING"
    assert _stored_status(ctx, later.id) == "TERMINATED"
    with ctx.db.reader() as session:
        deleted = session.scalars(
            select(OutboxMessage.payload).where(OutboxMessage.topic == "lease.delete")
        ).all()
    assert [p["lease"]["status"] for p in deleted] == ["DELETING", "DELETING"]
    assert manager.run_due() == 1  # the end, now
    assert _stored_status(ctx, running.id) == "TERMINATED"
    with ctx.db.reader() as session:
        ended = session.scalars(
            select(Assignment.released_at).where(Assignment.lease_id == running.id)
        ).all()
    assert ended == [T0 + dt.timedelta(minutes=5)]


def test_a_start_given_as_the_current_minute_is_booked_from_now(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """``blazar lease-create --start-date`` gives the current minute. A running lease deleted
    earlier in that minute held the only host until then: a new lease starting "this minute"
    is booked from now, so it fits, starts at once, and can grow its end while it runs."""
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    clock.set(T0 - HOUR)
    first = leases.create(ALICE, host_request("first", None, T0 + HOUR))
    manager.run_due()
    clock.set(T0 + dt.timedelta(seconds=20))
    leases.delete(ALICE, first.id)
    clock.set(T0 + dt.timedelta(seconds=45))
    second = leases.create(ALICE, host_request("second", T0, T0 + HOUR))
    assert second.start_date == T0 + dt.timedelta(seconds=45)
    manager.run_due()
    assert leases.get(ALICE, second.id).status == "ACTIVE"
    longer = leases.update(ALICE, second.id, LeaseChanges(end=T0 + 2 * HOUR))
    assert longer.end_date == T0 + 2 * HOUR
