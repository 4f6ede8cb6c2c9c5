"""Credits under concurrency on PostgreSQL with two ``climate api`` processes: many lease
creations against a balance that covers only some, while an admin takes credits back, never
overdraw it, and the ledger sums to the balance (docs/credits.md)."""

from __future__ import annotations

import datetime as dt
import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest

from climate.db import credits as credit_rows
from climate.db.engine import Database
from tests.conftest import _reset_pg
from tests.processes import Process, start_api

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
LEASES = 24
TAKES = 8
ENV = {"CLIMATE_CREDITS": "true", "CLIMATE_PRICES": json.dumps({"physical:host": "1.00"})}


def _create(url: str, n: int) -> int:
    start = dt.datetime(2031, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=n)
    body = {
        "name": f"l{n}",
        "start_date": start.isoformat(),
        "end_date": (start + dt.timedelta(hours=4)).isoformat(),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    return httpx.post(f"{url}/v1/leases", json=body, headers=MEMBER, timeout=60).status_code


def _take_back(url: str) -> int:
    answer = httpx.post(
        f"{url}/v1/projects/project-a/credits", json={"amount": "-3.00"}, timeout=60
    )
    return answer.status_code


@pytest.mark.slow
def test_concurrent_admissions_never_overdraw_a_balance(pg_url: str) -> None:
    _reset_pg(pg_url)
    processes: list[Process] = []
    db = Database(pg_url)
    try:
        api1, url1 = start_api(pg_url, env=ENV)
        processes.append(api1)
        api2, url2 = start_api(pg_url, env=ENV)
        processes.append(api2)
        assert httpx.post(f"{url1}/v1/os-hosts", json={"name": "h1"}).status_code == 201
        granted = httpx.post(f"{url2}/v1/projects/project-a/credits", json={"amount": "50"})
        assert granted.status_code == 201, granted.text
        urls = (url1, url2)
        with ThreadPoolExecutor(12) as pool:
            creating = [pool.submit(_create, urls[n % 2], n) for n in range(LEASES)]
            taking = [pool.submit(_take_back, urls[n % 2]) for n in range(TAKES)]
            created = [f.result() for f in creating]
            taken = [f.result() for f in taking]
        assert set(created) <= {201, 403}, created
        assert set(taken) <= {201, 409}, taken
        admitted, took = created.count(201), taken.count(201)
        assert created.count(403) > 0  # the balance covered only some
        with db.reader() as session:
            balance = credit_rows.balance(session, "project-a")
            amounts, encumbered = credit_rows.totals(session, "project-a")
        assert balance is not None and balance >= 0
        assert amounts == balance
        assert encumbered == admitted * 400
        assert Decimal(balance) == 5000 - admitted * 400 - took * 300
    finally:
        logs = [p.stop() for p in processes]
        db.dispose()
    for log in logs:
        assert "Traceback" not in log, log
