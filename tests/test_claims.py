"""Event claims of a manager that is gone are taken over within seconds, never while it runs:
SQLite's only manager ends them at start-up, PostgreSQL managers heartbeat (real processes,
killed with SIGKILL in the middle of a backend call that hangs)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from climate.backends.standalone import StandaloneBackend
from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.db.tables import Event, Lease, ManagerProcess
from climate.domain.clock import ManualClock
from climate.errors import InvalidInput
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request
from tests.processes import Process, start_api, start_manager

HANGING = {
    "CLIMATE_BACKEND": "faulty",
    "CLIMATE_FAULT_HANG_RATE": "1.0",
    "CLIMATE_BACKEND_TIMEOUT_SECONDS": "15",
}
"""The backend of the issue: every call hangs until the manager gives up on it after 15 s."""
TAKEN_OVER_WITHIN = 15.0
"""Well beyond the 5 s after which a silent manager counts as gone, far below the 120 s claim."""


def _lease_starting_now(url: str) -> str:
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    body = {
        "name": "now",
        "start_date": "now",
        "end_date": (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat(),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    response = httpx.post(f"{url}/v1/leases", json=body)
    assert response.status_code == 201, response.text
    lease_id: str = response.json()["lease"]["id"]
    return lease_id


def _start_event(db: Database, lease_id: str) -> Event:
    with db.reader() as session:
        query = select(Event).where(Event.lease_id == lease_id, Event.event_type == "start_lease")
        return session.scalars(query).one()


def _wait_for(
    db: Database, lease_id: str, until: Callable[[Event], bool], timeout: float
) -> tuple[Event, float]:
    """The lease's start event once ``until`` holds for it, and how long that took."""
    began = time.monotonic()
    while True:
        event = _start_event(db, lease_id)
        waited = time.monotonic() - began
        if until(event):
            return event, waited
        assert waited < timeout, (event.status, event.claimed_by, event.attempts)
        time.sleep(0.05)


def _claimed_by(process: Process) -> Callable[[Event], bool]:
    return lambda e: e.status == "IN_PROGRESS" and f":{process.proc.pid}:" in (e.claimed_by or "")


@pytest.mark.slow
def test_sqlite_serve_killed_during_a_hanging_start_runs_it_again_at_restart(
    sqlite_url: str,
) -> None:
    serve, url = start_api(sqlite_url, "serve", HANGING)
    db = Database(sqlite_url)
    restarted: Process | None = None
    try:
        lease_id = _lease_starting_now(url)
        _wait_for(db, lease_id, _claimed_by(serve), timeout=10)
        serve.kill()  # in the middle of the hanging backend call, its claim held for 120 s
        restarted, url = start_api(sqlite_url, "serve")  # a healthy backend this time
        event, waited = _wait_for(db, lease_id, lambda e: e.status == "DONE", TAKEN_OVER_WITHIN)
        # The attempt the dead manager started counts.
        assert (event.attempts, event.claimed_by) == (2, _manager_of(restarted, db))
        assert httpx.get(f"{url}/v1/leases/{lease_id}").json()["lease"]["status"] == "ACTIVE"
    finally:
        serve.stop()
        logs = restarted.stop() if restarted is not None else ""
        db.dispose()
    assert "Traceback" not in logs, logs
    assert "claimed by a manager that is gone" in logs, logs


def _manager_of(process: Process, db: Database) -> str | None:
    with db.reader() as session:
        names = session.scalars(select(Event.claimed_by).where(Event.claimed_by.is_not(None)))
        return next((n for n in names if f":{process.proc.pid}:" in (n or "")), None)


@pytest.mark.slow
def test_a_second_manager_on_one_sqlite_file_is_refused(sqlite_url: str) -> None:
    serve, _ = start_api(sqlite_url, "serve")
    try:
        second = start_manager(sqlite_url)
        assert second.proc.wait(timeout=20) != 0
        output = second.stop()
    finally:
        serve.stop()
    assert "already runs on this SQLite database" in output, output


@pytest.mark.slow
def test_postgresql_manager_killed_during_a_hanging_start_is_taken_over_in_seconds(
    pg_url: str,
) -> None:
    from tests.conftest import _reset_pg

    _reset_pg(pg_url)
    api, url = start_api(pg_url)
    hanging = start_manager(pg_url, HANGING)
    db = Database(pg_url)
    healthy: Process | None = None
    try:
        time.sleep(1.0)  # the hanging manager is up before the lease is due
        lease_id = _lease_starting_now(url)
        _wait_for(db, lease_id, _claimed_by(hanging), timeout=10)
        healthy = start_manager(pg_url)
        time.sleep(2.0)  # up, and leaving the claim of a live manager alone
        assert _claimed_by(hanging)(_start_event(db, lease_id))
        hanging.kill()
        event, waited = _wait_for(db, lease_id, lambda e: e.status == "DONE", TAKEN_OVER_WITHIN)
        assert f":{healthy.proc.pid}:" in (event.claimed_by or ""), event.claimed_by
        assert event.attempts == 2
    finally:
        api.stop()
        hanging.stop()
        logs = healthy.stop() if healthy is not None else ""
        db.dispose()
    assert "Traceback" not in logs, logs
    assert "taking it over" in logs, logs


@pytest.mark.slow
def test_postgresql_manager_stuck_in_a_backend_call_is_never_taken_over(pg_url: str) -> None:
    """Its claim expires (2 s) and it is silent on the event for 8 s, longer than a dead
    manager's 2 s: its heartbeat goes on, and nobody else touches the event until its own
    attempt times out."""
    from tests.conftest import _reset_pg

    _reset_pg(pg_url)
    short = {
        "CLIMATE_EVENT_CLAIM_SECONDS": "2",
        "CLIMATE_MANAGER_HEARTBEAT_SECONDS": "0.5",
        "CLIMATE_MANAGER_DEAD_SECONDS": "2",
    }
    api, url = start_api(pg_url)
    stuck = start_manager(pg_url, {**short, **HANGING, "CLIMATE_BACKEND_TIMEOUT_SECONDS": "8"})
    db = Database(pg_url)
    other: Process | None = None
    try:
        time.sleep(1.0)
        lease_id = _lease_starting_now(url)
        _wait_for(db, lease_id, _claimed_by(stuck), timeout=10)
        other = start_manager(pg_url, short)
        beats: list[dt.datetime] = []

        def stuck_attempt_over(event: Event) -> bool:
            with db.reader() as session:
                beats.extend(session.scalars(select(ManagerProcess.heartbeat_at)))
            return not _claimed_by(stuck)(event)

        event, waited = _wait_for(db, lease_id, stuck_attempt_over, timeout=20)
        # The stuck manager ended its own attempt: timed out, retried later, nobody else's.
        assert (event.status, event.attempts) == ("UNDONE", 1), event.claimed_by
        assert "timed out" in (event.last_error or "")
        assert waited > 4.0
        assert beats and max(beats) > dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2)
    finally:
        api.stop()
        stuck.stop()
        logs = other.stop() if other is not None else ""
        db.dispose()
    assert "Traceback" not in logs, logs


def test_an_event_whose_manager_died_during_its_last_attempt_fails_instead_of_running_again(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    """An event that kills its manager must not go on to kill every other manager in turn."""
    ctx = build_context(settings.model_copy(update={"event_max_attempts": 2}), db, clock)
    add_hosts(HostService(ctx), 1)
    lease = LeaseService(ctx).create(ALICE, host_request("l1", T0, T0 + dt.timedelta(hours=1)))
    for _ in range(2):  # two managers in turn died while they ran it
        assert Manager(ctx, StandaloneBackend())._claim()
        clock.advance(dt.timedelta(seconds=ctx.settings.event_claim_seconds + 1))
    survivor = Manager(ctx, StandaloneBackend())
    survivor.run_due()
    with db.reader() as session:
        stored = session.get(Lease, lease.id)
        start = session.scalars(select(Event).where(Event.event_type == "start_lease")).one()
        assert stored is not None
        assert (stored.status, start.status) == ("ERROR", "ERROR")
        assert "stopped during attempt 2" in (stored.status_reason or "")


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"manager_heartbeat_seconds": 0}, "manager_heartbeat_seconds"),
        ({"manager_heartbeat_seconds": 2, "manager_dead_seconds": 3}, "manager_dead_seconds"),
    ],
)
def test_heartbeat_settings_out_of_range_are_refused(values: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=f"^{field}: must be"):
        load_settings(env={}, **values)
