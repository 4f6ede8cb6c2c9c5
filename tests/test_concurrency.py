"""Many clients, several processes, one database: no host is ever double-booked and no event
fires twice."""

from __future__ import annotations

import datetime as dt
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import text

from climate.db.engine import Database
from tests.conftest import _reset_pg
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
