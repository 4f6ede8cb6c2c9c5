"""API and manager as separate processes: a change made through one API wakes the manager at
once (SQLite: the database's change counter; PostgreSQL: LISTEN/NOTIFY), not at its next poll."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from climate.db.engine import Database
from climate.db.types import as_utc
from tests import processes
from tests.conftest import free_port
from tests.processes import CLIMATE, start_api, start_manager, start_serving

# The manager's longest sleep is 30 s; an event applied within this proves it was woken.
WOKEN_WITHIN = 5.0


def _lease_starting_soon(url: str, seconds: float) -> str:
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    start = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    body = {
        "name": "soon",
        "start_date": start.isoformat(),
        "end_date": (start + dt.timedelta(hours=1)).isoformat(),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    response = httpx.post(f"{url}/v1/leases", json=body)
    assert response.status_code == 201, response.text
    lease_id: str = response.json()["lease"]["id"]
    return lease_id


def _start_lag(db: Database, lease_id: str, timeout: float = 20) -> float:
    deadline = time.monotonic() + timeout
    query = text(
        "SELECT time, done_at FROM events WHERE lease_id = :l AND event_type = 'start_lease'"
    )
    while time.monotonic() < deadline:
        with db.reader() as session:
            row = session.execute(query, {"l": lease_id}).one()
        if row.done_at is not None:  # raw SQL: SQLite gives text, PostgreSQL datetimes
            return (as_utc(row.done_at) - as_utc(row.time)).total_seconds()
        time.sleep(0.05)
    raise AssertionError("the lease never started")


@pytest.mark.slow
def test_separate_manager_is_woken_by_a_new_lease(database_url: str) -> None:
    api, url = start_api(database_url)
    manager = start_manager(database_url)
    db = Database(database_url)
    try:
        time.sleep(1.0)  # the manager is asleep, waiting for its first event
        lease_id = _lease_starting_soon(url, seconds=1.5)
        lag = _start_lag(db, lease_id)
        assert 0 <= lag < WOKEN_WITHIN, lag
        shown = httpx.get(f"{url}/v1/leases/{lease_id}").json()["lease"]
        assert shown["status"] == "ACTIVE"
    finally:
        api.stop()
        logs = manager.stop()
        db.dispose()
    assert "Traceback" not in logs, logs


@pytest.mark.slow
def test_serve_with_workers_runs_the_manager_beside_them(sqlite_url: str) -> None:
    """``climate serve --workers 2``: two API processes sharing the SQLite file's writers, and
    the manager, woken by what they write. Writes through both at once all answer, and one host
    is never given twice for one window."""
    serve, url = start_serving(["serve", "--workers", "2", "--database-url", sqlite_url])
    db = Database(sqlite_url)
    try:
        lease_id = _lease_starting_soon(url, seconds=1.5)
        assert 0 <= _start_lag(db, lease_id) < WOKEN_WITHIN
        start = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
        body = {
            "start_date": start.isoformat(),
            "end_date": (start + dt.timedelta(hours=1)).isoformat(),
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
            "events": [],
        }

        def create(i: int) -> int:
            # A connection each: the kernel hands them to either worker.
            named = body | {"name": f"race-{i}"}
            # Correctness, not speed: on a loaded 2-core machine 64 writes in turn take a while.
            return httpx.post(f"{url}/v1/leases", json=named, timeout=60).status_code

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(create, range(64)))
        assert sorted(set(codes)) == [201, 409] and codes.count(201) == 1, codes
        with db.reader() as session:
            served = session.execute(text("SELECT count(*) FROM host_allocations")).scalar_one()
        assert served == 2  # the lease that started, and the one admitted of the 64
    finally:
        logs = serve.stop()
        db.dispose()
    assert "Traceback" not in logs, logs
    assert "2 workers" in logs


def test_serve_refuses_a_number_of_workers_that_is_not_one_or_more() -> None:
    done = subprocess.run([CLIMATE, "serve", "--workers", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--workers: must be a whole number of processes above 0, not '0'" in done.stderr


def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of two xdist workers on one free port: the server that loses says so and exits,
    and ``start_serving`` tries another port."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        ports = iter([busy, free_port()])
        monkeypatch.setattr(processes, "free_port", lambda: next(ports))
        process, url = start_serving(["serve"], {"CLIMATE_DATA_DIR": str(tmp_path)})
    try:
        assert url != f"http://127.0.0.1:{busy}"
        assert httpx.get(url + "/healthz").status_code == 200
    finally:
        process.stop()


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--port", "{port}", "--database-url", "{url}"],
        ["manager", "--database-url", "{url}"],
        ["db", "--database-url", "{url}", "upgrade"],
    ],
)
def test_a_database_that_cannot_be_reached_at_start_up_is_one_error_line_not_a_traceback(
    command: list[str],
) -> None:
    """PostgreSQL not listening (nothing on the port): the command exits 1 saying what the
    database said, as a setting out of range does, not with a traceback."""
    url = f"postgresql://climate:s3cret@127.0.0.1:{free_port()}/climate"
    done = subprocess.run(
        [CLIMATE, *(part.format(url=url, port=free_port()) for part in command)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: database: connection failed:"), last
    assert "Connection refused" in last
    assert "s3cret" not in done.stderr
