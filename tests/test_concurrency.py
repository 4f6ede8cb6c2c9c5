"""Many clients, several processes, one database: no host is ever double-booked and no event
fires twice."""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import select, text

from climate.backends.base import Action, Result, Start
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.db import events as event_rows
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK, Database, retry_transient
from climate.db.leases import DueEvent
from climate.db.tables import Assignment, Lease
from climate.domain.clock import ManualClock
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0, _reset_pg
from tests.helpers import add_hosts, host_request, hosts_of
from tests.processes import Process, start_api, start_manager

HOSTS = 20
LEASES = 200
CLIENTS = 8

OVERLAPS = text(
    """
    SELECT count(*) FROM host_allocations a
    JOIN host_allocations b
      ON a.host_id = b.host_id AND a.id < b.id
     AND a.start_date < b.end_date AND b.start_date < a.end_date
    """
)


def _fmt(when: dt.datetime) -> str:
    return when.isoformat()


def _storm(urls: list[str]) -> dict[int, int]:
    """200 overlapping lease requests from 8 clients; returns the count of each status code."""
    began = time.monotonic()
    base = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    rng = random.Random(42)
    plans = []
    for i in range(LEASES):
        offset = rng.uniform(0, 12)
        plans.append((i, offset, rng.uniform(0.5, 2), rng.randint(1, 2), rng.randint(0, 1)))

    def create(plan: tuple[int, float, float, int, int]) -> int:
        i, offset, length, low, extra = plan
        high = low + extra
        # Windows are placed relative to when the storm began, and never in the past on a slow
        # machine: what matters is that they overlap heavily.
        start = base + dt.timedelta(seconds=max(offset, time.monotonic() - began + 1))
        end = start + dt.timedelta(seconds=length)
        body = {
            "name": f"storm-{i}",
            "start_date": _fmt(start),
            "end_date": _fmt(end),
            "reservations": [
                {
                    "resource_type": "physical:host",
                    "min": low,
                    "max": high,
                    "hypervisor_properties": "",
                    "resource_properties": "",
                }
            ],
            "events": [],
        }
        response = httpx.post(f"{urls[i % len(urls)]}/v1/leases", json=body, timeout=60)
        return response.status_code

    with ThreadPoolExecutor(CLIENTS) as pool:
        codes = list(pool.map(create, plans))
    return {code: codes.count(code) for code in set(codes)}


def _wait_all_ended(db: Database, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.reader() as session:
            left = session.execute(
                text("SELECT count(*) FROM events WHERE status <> 'DONE'")
            ).scalar_one()
        if left == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"{left} events still not done after {timeout} s")


def _check(db: Database, codes: dict[int, int]) -> None:
    assert set(codes) <= {201, 409}, codes
    assert codes.get(201, 0) > 20, codes  # enough admitted to make the check meaningful
    assert codes.get(409, 0) > 0, codes  # and enough contention to refuse some
    _wait_all_ended(db)
    with db.reader() as session:
        assert session.execute(OVERLAPS).scalar_one() == 0
        # every event ran exactly once: one claim each, all done
        attempts = session.execute(
            text("SELECT attempts, count(*) FROM events GROUP BY attempts")
        ).all()
        assert [tuple(row) for row in attempts] == [(1, 3 * codes[201])]
        statuses = session.execute(text("SELECT DISTINCT status FROM leases")).scalars().all()
        assert statuses == ["TERMINATED"]
        # each host handed over once per reservation that got it, and all given back
        handed = session.execute(text("SELECT count(*), count(released_at) FROM assignments")).one()
        allocated = session.execute(text("SELECT count(*) FROM host_allocations")).scalar_one()
        assert tuple(handed) == (allocated, allocated)


def _hosts(url: str) -> None:
    for i in range(HOSTS):
        response = httpx.post(f"{url}/v1/os-hosts", json={"name": f"node-{i}"}, timeout=10)
        assert response.status_code == 201


@pytest.mark.slow
def test_no_double_booking_from_eight_clients_on_sqlite(sqlite_url: str) -> None:
    server, url = start_api(sqlite_url, command="serve")
    db = Database(sqlite_url)
    try:
        _hosts(url)
        codes = _storm([url])
        _check(db, codes)
    finally:
        server.stop()
        db.dispose()


@pytest.mark.slow
def test_no_double_booking_with_two_apis_and_two_managers_on_postgresql(pg_url: str) -> None:
    _reset_pg(pg_url)
    processes: list[Process] = []
    db = Database(pg_url)
    try:
        api1, url1 = start_api(pg_url)
        api2, url2 = start_api(pg_url)
        processes += [api1, api2, start_manager(pg_url), start_manager(pg_url)]
        _hosts(url1)
        codes = _storm([url1, url2])
        _check(db, codes)
    except BaseException:
        for process in processes:
            print(f"--- climate {process.args[0]} ---\n{process.stop()[-5000:]}")  # noqa: T201
        raise
    finally:
        logs = [p.stop() for p in processes]
        db.dispose()
    assert not any("Traceback" in log for log in logs), logs


# -- an API change racing a manager that starts the same lease (PostgreSQL: real row locks) ------

HOUR = dt.timedelta(hours=1)
TWO_HOURS = 2 * HOUR
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def pg_ctx(pg_url: str, settings: Settings, clock: ManualClock) -> Iterator[ServiceContext]:
    _reset_pg(pg_url)
    db = Database(pg_url)
    yield build_context(settings, db, clock)
    db.dispose()


class Gated(StandaloneBackend):
    """A cloud whose start calls wait until the test lets them through."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        if isinstance(actions[0], Start):
            self.entered.set()
            assert self.go.wait(10)
        return super().handle(actions)


def _wait_for_a_lock_wait(db: Database) -> None:
    """Until some transaction of this database waits for a row lock."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with db.reader() as session:
            if session.execute(query).scalar_one():
                return
        time.sleep(0.02)
    raise AssertionError("nothing ever waited for a lock")


def _ended_cleanly(ctx: ServiceContext, lease_id: str) -> None:
    """The lease started, then ended through the backend: every event ran, the host is back."""
    with ctx.db.reader() as session:
        lease = session.get(Lease, lease_id)
        assert lease is not None
        assert lease.status == "TERMINATED"
        assert {e.event_type: e.status for e in lease.events} == {
            "start_lease": "DONE",
            "end_lease": "DONE",
        }
        held = session.scalars(select(Assignment).where(Assignment.lease_id == lease_id)).all()
        assert [a.released_at is not None for a in held] == [True]


@contextlib.contextmanager
def _claiming(
    ctx: ServiceContext, manager: Manager, kinds: Sequence[str] = ("start_lease",)
) -> Iterator[list[DueEvent]]:
    """What ``Manager._claim`` does for the due events, of ``kinds``, committed only when the
    block ends."""
    with ctx.db.transaction() as session:
        now = ctx.clock.now()
        due = lease_rows.due_events(session, now, 10, alive_since=now)
        assert [e.event_type for e in due] == list(kinds)
        ids = [e.id for e in due]
        lease_rows.claim(session, ids, manager.name, now, now + dt.timedelta(minutes=1))
        yield due


def test_deleting_a_lease_while_a_manager_claims_its_start_still_ends_it(
    pg_ctx: ServiceContext, clock: ManualClock
) -> None:
    """Found by the stress harness: the delete read the lease PENDING, a manager claimed the
    start, the delete dropped the end event and the manager wrote ACTIVE: a lease for ever."""
    add_hosts(HostService(pg_ctx), 1)
    leases = LeaseService(pg_ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + TWO_HOURS))
    clock.advance(MINUTE)  # the manager is a little late: the host is held until the delete
    manager = Manager(pg_ctx, StandaloneBackend())
    with ThreadPoolExecutor(1) as pool:
        with _claiming(pg_ctx, manager) as due:
            deleting = pool.submit(leases.delete, ALICE, lease.id)
            _wait_for_a_lock_wait(pg_ctx.db)  # the delete waits for the claim to commit
        deleting.result(timeout=30)
    manager._execute(due)
    manager.run_due()  # the end, moved to the deletion time, follows the start
    _ended_cleanly(pg_ctx, lease.id)


def test_deleting_a_lease_while_its_planned_start_runs_waits_for_it_without_deadlock(
    pg_ctx: ServiceContext, clock: ManualClock
) -> None:
    """The planned path holds the start's row while the backend works, then writes the lease:
    a delete that wrote the lease first and then waited for the events deadlocked with it."""
    add_hosts(HostService(pg_ctx), 1)
    leases = LeaseService(pg_ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + TWO_HOURS))
    clock.advance(MINUTE)
    backend = Gated()
    manager = Manager(pg_ctx, backend)
    assert manager.prepare() == 1
    with ThreadPoolExecutor(2) as pool:
        starting = pool.submit(manager.run_due)
        assert backend.entered.wait(10)
        deleting = pool.submit(leases.delete, ALICE, lease.id)
        _wait_for_a_lock_wait(pg_ctx.db)
        backend.go.set()
        assert starting.result(timeout=30) >= 1
        deleting.result(timeout=30)
    manager.run_due()
    _ended_cleanly(pg_ctx, lease.id)


def test_deleting_a_lease_while_a_manager_ends_it_keeps_the_end_the_manager_commits(
    pg_ctx: ServiceContext, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the stress harness: the delete read the lease ACTIVE while a manager ran its
    claimed end, then overwrote the TERMINATED the manager committed with DELETING, and no
    event was left to finish it."""
    add_hosts(HostService(pg_ctx), 1)
    leases = LeaseService(pg_ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + TWO_HOURS))
    manager = Manager(pg_ctx, StandaloneBackend())
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    clock.advance(TWO_HOURS + MINUTE)
    written, go = threading.Event(), threading.Event()
    finish = event_rows.finish_events

    def finish_then_wait(*args: Any, **kwargs: Any) -> None:
        finish(*args, **kwargs)  # the lease's row is written: the manager holds it
        written.set()
        assert go.wait(10)

    with _claiming(pg_ctx, manager, ("before_end_lease", "end_lease")) as due:
        pass
    monkeypatch.setattr(event_rows, "finish_events", finish_then_wait)
    with ThreadPoolExecutor(2) as pool:
        ending = pool.submit(manager._execute, due)
        assert written.wait(10)
        deleting = pool.submit(leases.delete, ALICE, lease.id)
        _wait_for_a_lock_wait(pg_ctx.db)
        go.set()
        ending.result(timeout=30)
        deleting.result(timeout=30)
    with pg_ctx.db.reader() as session:
        ended = session.get(Lease, lease.id)
        assert ended is not None
        assert (ended.status, ended.deleted_at is not None) == ("TERMINATED", True)
        assert {e.event_type: e.status for e in ended.events} == {
            "start_lease": "DONE",
            "before_end_lease": "DONE",
            "end_lease": "DONE",
        }


def test_a_lease_whose_start_a_manager_claimed_cannot_be_moved_to_a_later_start(
    pg_ctx: ServiceContext,
) -> None:
    """The lease still shows PENDING while its start runs; moving it would leave it ACTIVE on
    hosts allocated for another window."""
    add_hosts(HostService(pg_ctx), 2)
    leases = LeaseService(pg_ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + TWO_HOURS))
    later = LeaseChanges(start=T0 + dt.timedelta(hours=1), end=T0 + 2 * TWO_HOURS)
    manager = Manager(pg_ctx, StandaloneBackend())
    with ThreadPoolExecutor(1) as pool:
        with _claiming(pg_ctx, manager) as due:
            moving = pool.submit(leases.update, ALICE, lease.id, later)
            _wait_for_a_lock_wait(pg_ctx.db)
        with pytest.raises(InvalidInput, match="Cannot modify the start date of already started"):
            moving.result(timeout=30)
    manager._execute(due)
    shown = leases.get(ALICE, lease.id)
    assert (shown.status, shown.start_date, shown.end_date) == ("ACTIVE", T0, T0 + TWO_HOURS)
    assert hosts_of(shown) == hosts_of(lease)


def test_a_lease_whose_start_a_manager_is_running_is_not_moved_to_admit_another(
    pg_url: str, settings: Settings, clock: ManualClock
) -> None:
    """Late binding moves pending leases; one that still shows PENDING while a manager hands
    out its hosts must stay where it is, or it runs on hosts another lease is then given."""
    _reset_pg(pg_url)
    db = Database(pg_url)
    api = build_context(settings, db, clock)
    manager_clock = ManualClock(T0 + TWO_HOURS)
    backend = Gated()
    manager = Manager(build_context(settings, db, manager_clock), backend)
    hosts, leases = HostService(api), LeaseService(api)
    one = hosts.create(ADMIN, "compute-z1", {"zone": "z1"}).id
    hosts.create(ADMIN, "compute-z2", {"zone": "z2"})
    a = leases.create(ALICE, host_request("a", T0 + TWO_HOURS, T0 + 3 * TWO_HOURS))
    in_z2 = '["==", "$zone", "z2"]'
    leases.create(BOB, host_request("b", T0 + 8 * HOUR, T0 + 12 * HOUR, resource_properties=in_z2))
    assert hosts_of(a) == {one}
    # Only a's host is in z1; a could move to host 2, but its start is due and being run. The
    # API's clock is a second behind: its request began just before the start was due.
    clock.set(T0 + TWO_HOURS - dt.timedelta(seconds=1))
    assert manager.prepare() == 1
    try:
        with ThreadPoolExecutor(1) as pool:
            starting = pool.submit(manager.run_due)
            try:
                assert backend.entered.wait(10)
                with pytest.raises(NotEnoughCapacity):
                    leases.create(
                        ALICE,
                        host_request(
                            "c",
                            T0 + 4 * HOUR,
                            T0 + 10 * HOUR,
                            resource_properties='["==", "$zone", "z1"]',
                        ),
                    )
            finally:
                backend.go.set()
            assert starting.result(timeout=30) == 1
        shown = leases.get(ALICE, a.id)
        assert shown.status == "ACTIVE"
        assert hosts_of(shown) == {one}
        with db.reader() as session:
            handed = session.scalars(
                select(Assignment.resource_id).where(Assignment.lease_id == a.id)
            ).all()
        assert handed == [str(one)]
    finally:
        db.dispose()


def test_a_refused_admission_undoes_its_cache_changes_before_it_lets_the_next_one_in(
    pg_url: str,
) -> None:
    """Found by the stress harness: the in-memory calendar was put back after the rollback had
    released the admission lock, so the next admission of the process could read the refused
    one's allocations (and miss those it had replaced): a host offered twice, a 500."""
    _reset_pg(pg_url)
    db = Database(pg_url)
    seen: list[str] = []

    def undo() -> None:
        with psycopg.connect(pg_url) as other:
            other.execute("SET lock_timeout = '200ms'")
            try:
                other.execute("UPDATE locks SET version = version + 1 WHERE name = 'admission'")
                seen.append("another admission got in")
            except psycopg.errors.LockNotAvailable:
                seen.append("still held")

    try:
        with pytest.raises(NotEnoughCapacity), db.transaction(lock=ADMISSION_LOCK) as session:
            session.info.setdefault("on_rollback", []).append(undo)
            raise NotEnoughCapacity("refused")
    finally:
        db.dispose()
    assert seen == ["still held"]


def test_a_use_case_aborted_to_break_a_deadlock_runs_again(pg_url: str) -> None:
    """PostgreSQL aborts one transaction of a deadlock; the use case that lost runs again."""
    _reset_pg(pg_url)
    db = Database(pg_url)
    ready = threading.Barrier(2, timeout=10)
    runs: list[int] = []

    @retry_transient
    def use_case() -> None:
        runs.append(1)
        with db.transaction() as session:
            # This side detects the deadlock first, so it is the one aborted.
            session.execute(text("SET LOCAL deadlock_timeout = '100ms'"))
            session.execute(text("UPDATE locks SET version = version WHERE name = 'admission'"))
            if len(runs) == 1:
                ready.wait()
            session.execute(text("UPDATE locks SET version = version WHERE name = 'inventory'"))

    def other() -> None:
        with db.transaction() as session:
            session.execute(text("SET LOCAL deadlock_timeout = '10s'"))
            session.execute(text("UPDATE locks SET version = version WHERE name = 'inventory'"))
            ready.wait()
            session.execute(text("UPDATE locks SET version = version WHERE name = 'admission'"))

    rival = threading.Thread(target=other)
    rival.start()
    use_case()
    rival.join(timeout=20)
    assert not rival.is_alive()
    assert len(runs) == 2
    db.dispose()
