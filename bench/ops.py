"""Scenario ``ops``: a ``/metrics`` scrape and a month's usage report over 10,000 leases.

The database is seeded directly (hosts, leases of one host each, their reservations,
allocations and events, most started and ended, some running or pending) over one month, then
``climate serve`` starts on it and both are timed over HTTP from the client."""

from __future__ import annotations

import datetime as dt
import random
import statistics
import time
import uuid
from typing import Any

import httpx

from bench.server import climate_server
from bench.stats import table
from bench.targets import Target

LEASES = 10_000
HOSTS = 200
MONTH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NEXT_MONTH = dt.datetime(2030, 2, 1, tzinfo=dt.UTC)
SCRAPES = 20
REPORTS = 5


def seed(database_url: str, leases: int = LEASES, hosts: int = HOSTS) -> None:
    """``leases`` one-host leases over January 2030, none overlapping on a host."""
    from sqlalchemy import insert, text

    from climate.db import migrate
    from climate.db.engine import Database
    from climate.db.tables import Event, Host, HostAllocation, Lease, Reservation, table_of

    db = Database(database_url)
    migrate.upgrade(db)
    rng = random.Random(18)
    now = MONTH
    per_host = leases // hosts
    host_rows, lease_rows, reservation_rows, allocation_rows, event_rows = [], [], [], [], []
    for h in range(1, hosts + 1):
        host_rows.append(
            {"id": h, "hypervisor_hostname": f"node-{h}", "created_at": now, "reservable": True}
        )
        cursor = MONTH
        for n in range(per_host):
            start = cursor + dt.timedelta(minutes=rng.randrange(0, 120))
            end = start + dt.timedelta(minutes=rng.randrange(60, 600))
            cursor = end
            lease_id, reservation_id = str(uuid.uuid4()), str(uuid.uuid4())
            status = "TERMINATED" if n < per_host - 2 else rng.choice(["ACTIVE", "PENDING"])
            lease_rows.append(
                {
                    "id": lease_id,
                    "name": f"l-{h}-{n}",
                    "project_id": f"project-{rng.randrange(50)}",
                    "user_id": "bench",
                    "start_date": start,
                    "end_date": end,
                    "status": status,
                    "created_at": now,
                }
            )
            reservation_rows.append(
                {
                    "id": reservation_id,
                    "lease_id": lease_id,
                    "resource_type": "physical:host",
                    "status": "active",
                    "params": {"min": 1, "max": 1},
                    "created_at": now,
                }
            )
            allocation_rows.append(
                {
                    "reservation_id": reservation_id,
                    "lease_id": lease_id,
                    "host_id": h,
                    "start_date": start,
                    "end_date": end,
                }
            )
            started = status != "PENDING"
            ended = status == "TERMINATED"
            for seq, (kind, time_at, done) in enumerate(
                (("start_lease", start, started), ("end_lease", end, ended))
            ):
                event_rows.append(
                    {
                        "id": str(uuid.uuid4()),
                        "lease_id": lease_id,
                        "event_type": kind,
                        "time": time_at,
                        "not_before": time_at,
                        "priority": 1 - seq,
                        "seq": seq * 2,
                        "status": "DONE" if done else "UNDONE",
                        "created_at": now,
                        "done_at": time_at + dt.timedelta(seconds=rng.randrange(0, 90))
                        if done
                        else None,
                    }
                )
    with db.transaction() as session:
        for model, rows in (
            (Host, host_rows),
            (Lease, lease_rows),
            (Reservation, reservation_rows),
            (HostAllocation, allocation_rows),
            (Event, event_rows),
        ):
            session.execute(insert(table_of(model)), rows)
    if db.dialect == "postgresql":
        # As autovacuum would soon after such a load: without statistics the planner joins
        # allocations to events by scanning.
        with db.engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    db.dispose()


def run_ops(db: str = "sqlite") -> dict[str, Any]:
    with climate_server(db, prepare=seed) as server, httpx.Client(timeout=60) as http:
        scrape_ms = []
        for _ in range(SCRAPES):
            began = time.perf_counter()
            response = http.get(f"{server.base_url}/metrics")
            scrape_ms.append((time.perf_counter() - began) * 1000)
            assert response.status_code == 200, response.text
        usage_ms = []
        params = {"start": MONTH.isoformat(), "end": NEXT_MONTH.isoformat()}
        for _ in range(REPORTS):
            began = time.perf_counter()
            response = http.get(f"{server.base_url}/v1/usage", params=params)
            usage_ms.append((time.perf_counter() - began) * 1000)
            assert response.status_code == 200, response.text
        projects = len(response.json()["usage"]["projects"])
    return {
        "db": db,
        "leases": LEASES,
        "hosts": HOSTS,
        "scrape_ms": scrape_ms,
        "usage_ms": usage_ms,
        "usage_projects": projects,
    }


def print_ops(result: dict[str, Any]) -> None:
    print()
    print(f"scenario ops: {result['leases']} leases on {result['hosts']} hosts ({result['db']})")
    rows = [
        [name, len(values), f"{statistics.median(values):.1f}", f"{max(values):.1f}"]
        for name, values in (
            ("GET /metrics", result["scrape_ms"]),
            ("GET /v1/usage (month)", result["usage_ms"]),
        )
    ]
    print(table(["", "n", "median ms", "max ms"], rows))


def ops_targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "ops: /metrics scrape, 10,000 leases (median)",
            statistics.median(result["scrape_ms"]),
            50,
            "ms",
        ),
        Target(
            "ops: usage of a month of 10,000 leases (median)",
            statistics.median(result["usage_ms"]),
            500,
            "ms",
            note=f"{result['usage_projects']} projects",
        ),
    ]
