"""The manager runs the events due together as batches: planned ahead of their instant or
claimed when due, with a failing event isolated from the others of its batch."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

import pytest
from sqlalchemy import select

from climate.backends.base import ACTION_NAMES, Action, BeforeEnd, End, Result, Start
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.db import assignments
from climate.db.engine import Database
from climate.db.tables import Assignment, Event
from climate.domain.clock import ManualClock
from climate.manager import service
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, BOB, T0
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)
START = T0 + HOUR


class RecordingBackend(StandaloneBackend):
    """The standalone backend, noting each batch and each handover in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.batches: list[tuple[str, int]] = []

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        kind = ACTION_NAMES[type(actions[0])]
        self.batches.append((kind, len(actions)))
        for action in actions:
            if isinstance(action, Start | End):
                self.calls += [(kind, h.lease_id) for h in action.handovers]
            elif isinstance(action, BeforeEnd):
                self.calls += [(kind, h.lease_id) for h, _ in action.steps]
        return super().handle(actions)


def _project(action: Action) -> str | None:
    return action.handovers[0].project_id if isinstance(action, Start) else None


class FailingFor(StandaloneBackend):
    """A cloud that fails the start of the leases of ``project`` (the others of a batch
    succeed)."""

    name = "failing"

    def __init__(self, project: str) -> None:
        self.project = project

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        return [
            RuntimeError("cloud said no") if _project(a) == self.project else result
            for a, result in zip(actions, super().handle(actions), strict=True)
        ]


class BulkFailingFor(FailingFor):
    """A cloud whose bulk call fails as a whole when one of its actions would: the manager must
    fall back to one event at a time."""

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if len(actions) > 1 and any(_project(a) == self.project for a in actions):
            raise RuntimeError("bulk call refused")
        return super().handle(actions)


def _events(ctx: ServiceContext, lease_id: str) -> dict[str, Event]:
    with ctx.db.reader() as session:
        rows = session.scalars(select(Event).where(Event.lease_id == lease_id)).all()
        return {e.event_type: e for e in rows}


def _assignments(ctx: ServiceContext) -> list[Assignment]:
    with ctx.db.reader() as session:
        return list(session.scalars(select(Assignment)).all())


def _run_at(manager: Manager, clock: ManualClock, when: dt.datetime, *, planned: bool) -> int:
    """Run what is due at ``when``: planned a second ahead (as the loop does), or not."""
    if planned:
        clock.set(when - dt.timedelta(seconds=1))
        manager.prepare()
        assert manager.run_due() == 0  # nothing before its time
    clock.set(when)
    return manager.run_due()


@pytest.mark.parametrize("planned", [False, True], ids=["claimed", "planned"])
def test_start_before_end_and_end_due_together_run_in_one_pass_in_lifecycle_order(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    planned: bool,
) -> None:
    add_hosts(hosts, 2)
    # Before-end defaults to an hour before the end, clipped to the start: all three are due
    # once the end has come (the manager was down, or the lease is that short).
    first = leases.create(ALICE, host_request("one", START, START + HOUR / 2))
    second = leases.create(BOB, host_request("two", START, START + HOUR / 2))
    backend = RecordingBackend()
    manager = Manager(ctx, backend)
    claims = 0
    claim = manager._claim

    def counting_claim() -> list[object]:
        nonlocal claims
        taken = claim()
        claims += bool(taken)
        return list(taken)

    manager._claim = counting_claim  # type: ignore[method-assign,assignment]
    clock.set(START + HOUR / 2)
    if planned:
        assert manager.prepare() == 6
    assert manager.run_due() == 6
    # One batch: no second loop round for the later events of each lease.
    assert claims == (0 if planned else 1)
    assert backend.batches == [("start", 2), ("before_end", 2), ("end", 2)]
    for lease in (first, second):
        assert [kind for kind, lease_id in backend.calls if lease_id == lease.id] == [
            "start",
            "before_end",
            "end",
        ]
        events = _events(ctx, lease.id)
        assert {e.status for e in events.values()} == {"DONE"}
        assert {e.attempts for e in events.values()} == {1}
        assert leases.get(ALICE if lease is first else BOB, lease.id).status == "TERMINATED"
    records = _assignments(ctx)
    assert len(records) == 2
    assert all(r.released_at is not None for r in records)


@pytest.fixture
def slow_retry(settings: Settings, db: Database, clock: ManualClock) -> ServiceContext:
    """A context whose failed events wait 10 s (then 20 s...) before their next attempt."""
    return build_context(settings.model_copy(update={"event_retry_base_seconds": 10}), db, clock)


@pytest.mark.parametrize("planned", [False, True], ids=["claimed", "planned"])
@pytest.mark.parametrize("backend_kind", [FailingFor, BulkFailingFor], ids=["per-event", "bulk"])
def test_one_failing_start_in_a_batch_leaves_the_others_started(
    slow_retry: ServiceContext, clock: ManualClock, planned: bool, backend_kind: type[FailingFor]
) -> None:
    ctx = slow_retry
    add_hosts(HostService(ctx), 4)
    leases = LeaseService(ctx)
    # Ending half an hour after the start, so the before-end warning is due with the start.
    end = START + HOUR / 2
    fine = [leases.create(ALICE, host_request(f"ok-{i}", START, end)) for i in range(3)]
    doomed = leases.create(BOB, host_request("doomed", START, end))
    backend = backend_kind(BOB.project_id)
    manager = Manager(ctx, backend)
    # Four starts and their warnings: three start and warn; one start fails, and its warning
    # is not run but left waiting for its start.
    assert _run_at(manager, clock, START, planned=planned) == 7
    for lease in fine:
        assert leases.get(ALICE, lease.id).status == "ACTIVE"
        events = _events(ctx, lease.id)
        assert events["start_lease"].status == events["before_end_lease"].status == "DONE"
    assert leases.get(BOB, doomed.id).status == "STARTING"
    events = _events(ctx, doomed.id)
    start, warning = events["start_lease"], events["before_end_lease"]
    assert (start.status, start.attempts, start.last_error) == (
        "UNDONE",
        1,
        "RuntimeError: cloud said no",
    )
    assert start.not_before == START + dt.timedelta(seconds=10)
    assert (warning.status, warning.attempts, warning.claimed_by) == ("UNDONE", 0, None)
    # Its records were rolled back with it; the others' stand.
    assert sorted(r.lease_id for r in _assignments(ctx)) == sorted(x.id for x in fine)
    # Once the cloud agrees, the start and then its warning run, in one pass.
    backend.project = "nobody"
    clock.advance(dt.timedelta(seconds=10))
    assert manager.run_due() == 2
    assert leases.get(BOB, doomed.id).status == "ACTIVE"
    assert {e.status for e in _events(ctx, doomed.id).values()} == {"DONE", "UNDONE"}


def test_failed_planned_start_is_retried_after_backoff(
    slow_retry: ServiceContext, clock: ManualClock
) -> None:
    ctx = slow_retry
    add_hosts(HostService(ctx), 2)
    leases = LeaseService(ctx)
    ok = leases.create(ALICE, host_request("ok", START, START + 3 * HOUR))
    doomed = leases.create(BOB, host_request("doomed", START, START + 3 * HOUR))
    backend = FailingFor(BOB.project_id)
    manager = Manager(ctx, backend)
    assert _run_at(manager, clock, START, planned=True) == 2
    assert leases.get(ALICE, ok.id).status == "ACTIVE"
    assert leases.get(BOB, doomed.id).status == "STARTING"
    start = _events(ctx, doomed.id)["start_lease"]
    assert (start.status, start.attempts, start.claimed_by) == ("UNDONE", 1, None)
    assert start.not_before == START + dt.timedelta(seconds=10)
    backend.project = "nobody"
    clock.advance(dt.timedelta(seconds=10))
    assert manager.run_due() == 1
    assert leases.get(BOB, doomed.id).status == "ACTIVE"


def test_plan_runs_at_its_instant_in_one_transaction(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_hosts(hosts, 20)
    created = [
        leases.create(ALICE, host_request(f"l{i}", START, START + 3 * HOUR)) for i in range(20)
    ]
    backend = RecordingBackend()
    manager = Manager(ctx, backend)
    clock.set(START - dt.timedelta(seconds=1))
    assert manager.prepare() == 20
    clock.set(START - dt.timedelta(milliseconds=1))
    assert manager.run_due() == 0
    clock.set(START)
    with caplog.at_level(logging.INFO, logger="climate.manager.service"):
        assert manager.run_due() == 20
    assert "20 event(s) of 20 lease(s) done" in caplog.text
    assert "(planned)" in caplog.text
    assert backend.batches == [("start", 20)]
    assert {leases.get(ALICE, x.id).status for x in created} == {"ACTIVE"}
    # Taken in the same transaction that ran them: counted as one attempt, by this manager.
    events = [_events(ctx, x.id)["start_lease"] for x in created]
    assert {(e.status, e.attempts, e.claimed_by) for e in events} == {("DONE", 1, manager.name)}
    assert {e.done_at for e in events} == {START}
    assert {r.assigned_at for r in _assignments(ctx)} == {START}


def test_plan_gone_stale_falls_back_to_claiming(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_hosts(hosts, 3)
    kept = [leases.create(ALICE, host_request(f"k{i}", START, START + 3 * HOUR)) for i in range(2)]
    dropped = leases.create(ALICE, host_request("dropped", START, START + 3 * HOUR))
    manager = Manager(ctx, RecordingBackend())
    clock.set(START - dt.timedelta(seconds=1))
    assert manager.prepare() == 3
    leases.delete(ALICE, dropped.id)  # after the plan was made
    clock.set(START)
    with caplog.at_level(logging.INFO, logger="climate.manager.service"):
        assert manager.run_due() == 2
    assert "leases changed since" in caplog.text
    assert {leases.get(ALICE, x.id).status for x in kept} == {"ACTIVE"}
    assert sorted(r.lease_id for r in _assignments(ctx)) == sorted(x.id for x in kept)


def test_plan_of_events_another_manager_ran_is_dropped(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 3)
    for i in range(3):
        leases.create(ALICE, host_request(f"l{i}", START, START + 3 * HOUR))
    planner, other = Manager(ctx, RecordingBackend()), Manager(ctx, RecordingBackend())
    clock.set(START - dt.timedelta(seconds=1))
    assert planner.prepare() == 3
    clock.set(START)
    assert other.run_due() == 3
    assert planner.run_due() == 0
    assert len(_assignments(ctx)) == 3


def test_deleted_running_lease_ends_early_beside_a_planned_end(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_hosts(hosts, 2)
    manager = Manager(ctx, RecordingBackend())
    early = leases.create(ALICE, host_request("early", START, START + 5 * HOUR))
    on_time = leases.create(ALICE, host_request("on-time", START, START + 2 * HOUR))
    _run_at(manager, clock, START, planned=True)
    # Deleting the running lease moves its end to now, the instant the other one ends: the
    # on-time end is planned, the early one (its resources go back through the resource type,
    # in the transaction) is claimed.
    clock.set(START + 2 * HOUR)
    leases.delete(ALICE, early.id)
    assert manager.prepare() == 2  # the on-time lease's warning (an hour ago) and end
    with caplog.at_level(logging.INFO, logger="climate.manager.service"):
        assert manager.run_due() == 3
    assert "(planned)" in caplog.text and "(claimed)" in caplog.text
    with ctx.db.reader() as session:
        from climate.db.tables import HostAllocation, Lease

        rows = [session.get(Lease, x.id) for x in (early, on_time)]
        assert [x.status for x in rows if x is not None] == ["TERMINATED", "TERMINATED"]
        ends = session.scalars(
            select(HostAllocation.end_date).where(HostAllocation.lease_id == early.id)
        ).all()
        assert list(ends) == [START + 2 * HOUR]
    assert all(r.released_at == START + 2 * HOUR for r in _assignments(ctx))


def test_small_batches_still_keep_each_lease_in_order(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With fewer heads per batch than leases, every lease's events still all run, in order."""
    monkeypatch.setattr(service, "BATCH", 2)
    add_hosts(hosts, 5)
    created = [leases.create(ALICE, host_request(f"l{i}", START, START + HOUR)) for i in range(5)]
    backend = RecordingBackend()
    manager = Manager(ctx, backend)
    clock.set(START + HOUR)
    assert manager.run_due() == 15
    for lease in created:
        assert [k for k, lease_id in backend.calls if lease_id == lease.id] == [
            "start",
            "before_end",
            "end",
        ]
    assert max(n for _, n in backend.batches) <= 2


def test_planned_start_notifies_with_the_lease_as_it_became(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    from climate.db.tables import OutboxMessage

    ctx = build_context(
        settings.model_copy(update={"webhooks": ("http://127.0.0.1:9/hook",)}), db, clock
    )
    add_hosts(HostService(ctx), 2)
    leases = LeaseService(ctx)
    for name in ("a", "b"):
        leases.create(ALICE, host_request(name, START, START + 3 * HOUR))
    manager = Manager(ctx, RecordingBackend())
    assert _run_at(manager, clock, START, planned=True) == 2
    with db.reader() as session:
        sent = session.scalars(
            select(OutboxMessage).where(OutboxMessage.topic == "lease.start")
        ).all()
        assert len(sent) == 2
        for message in sent:
            lease = message.payload["lease"]
            assert lease["status"] == "ACTIVE"
            assert [r["status"] for r in lease["reservations"]] == ["active"]
            assert len(lease["events"]) == 3


def test_loop_sleeps_until_the_lead_time_then_plans(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_hosts(hosts, 1)
    leases.create(ALICE, host_request("l", START, START + 3 * HOUR))
    manager = Manager(ctx, RecordingBackend())
    clock.set(START - dt.timedelta(seconds=10))
    assert manager._sleep_or_prepare() == pytest.approx(10 - service.PREPARE_SECONDS)
    assert manager._plan is None
    clock.set(START - dt.timedelta(seconds=service.PREPARE_SECONDS / 2))
    assert manager._sleep_or_prepare() == pytest.approx(service.PREPARE_SECONDS / 2)
    assert manager._plan is not None and manager._plan.due == START
    assert manager.run_due() == 0
    clock.set(START)
    with caplog.at_level(logging.INFO, logger="climate.manager.service"):
        assert manager.run_due() == 1
    assert "(planned)" in caplog.text


def test_bulk_assignments_are_recorded_and_released_once(ctx: ServiceContext) -> None:
    grants = [
        assignments.Grant(f"res-{i}", "lease", "proj", "physical:host", str(i), T0)
        for i in range(3)
    ]
    with ctx.db.transaction() as session:
        assert assignments.assign_many(session, [*grants, grants[0]]) == 3
        assert assignments.assign_many(session, grants) == 0  # idempotent
        assert assignments.release_many(session, ["res-0", "res-1"], T0 + HOUR) == 2
        assert assignments.release_many(session, ["res-0", "res-1"], T0 + HOUR) == 0
    records = sorted(_assignments(ctx), key=lambda r: r.resource_id)
    assert [(r.reservation_id, r.assigned_at) for r in records] == [
        (f"res-{i}", T0) for i in range(3)
    ]
    assert [r.released_at for r in records] == [T0 + HOUR, T0 + HOUR, None]
