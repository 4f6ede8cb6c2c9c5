"""Scenario ``demand``: the demand report of a month and its replay ("how many more hosts would
have admitted 80% of the refused requests"), over the ``ops`` month of 10,000 leases on 200
hosts plus 2,000 refused requests of 1 to 4 hosts for 1 to 10 hours.

The database is seeded directly (``bench.ops.seed``, then the refused demand rows), then
``climate serve`` starts on it and the report is timed over HTTP from the client, with and
without the replay."""

from __future__ import annotations

import datetime as dt
import random
import statistics
import time
from typing import Any

import httpx

from bench.ops import MONTH, NEXT_MONTH
from bench.ops import seed as seed_leases
from bench.server import climate_server
from bench.stats import table
from bench.targets import Target

REFUSALS = 2_000
TARGET_PERCENT = 80
REPORTS = 3


def seed(database_url: str) -> None:
    """The ``ops`` month, and ``REFUSALS`` refused host requests in it, in the order asked."""
    from sqlalchemy import insert

    from climate.db.engine import Database
    from climate.db.records import RefusedDemand
    from climate.db.tables import table_of

    seed_leases(database_url)
    rng = random.Random(18)
    month = int((NEXT_MONTH - MONTH).total_seconds())
    rows = []
    for n in range(REFUSALS):
        start = MONTH + dt.timedelta(seconds=rng.randrange(0, month - 36_000))
        count = rng.randrange(1, 5)
        params = {
            "min": count,
            "max": count,
            "hypervisor_properties": "",
            "resource_properties": "",
        }
        rows.append(
            {
                "at": MONTH + dt.timedelta(seconds=n),
                "project_id": f"project-{rng.randrange(50)}",
                "user_id": "bench",
                "lease_id": None,
                "lease_name": f"refused-{n}",
                "step": "create",
                "outcome": "refused",
                "reason": "too_few_free",
                "message": "not enough hosts",
                "resource_type": "physical:host",
                "count_min": count,
                "count_max": count,
                "properties": "",
                "params": params,
                "start_date": start,
                "end_date": start + dt.timedelta(seconds=rng.randrange(3_600, 36_000)),
                "offer": None,
            }
        )
    db = Database(database_url)
    with db.transaction() as session:
        session.execute(insert(table_of(RefusedDemand)), rows)
    db.dispose()


def _timed(http: httpx.Client, url: str, params: dict[str, str]) -> tuple[float, Any]:
    began = time.perf_counter()
    response = http.get(url, params=params)
    elapsed = time.perf_counter() - began
    assert response.status_code == 200, response.text
    return elapsed, response.json()["demand"]


def run_demand(db: str = "sqlite") -> dict[str, Any]:
    period = {"start": MONTH.isoformat(), "end": NEXT_MONTH.isoformat()}
    asked = {**period, "resource_type": "physical:host", "target": str(TARGET_PERCENT)}
    with climate_server(db, prepare=seed) as server, httpx.Client(timeout=120) as http:
        url = f"{server.base_url}/v1/demand"
        report_s, replay_s = [], []
        for _ in range(REPORTS):
            elapsed, _found = _timed(http, url, period)
            report_s.append(elapsed)
            elapsed, found = _timed(http, url, asked)
            replay_s.append(elapsed)
    return {"db": db, "refusals": REFUSALS, "report_s": report_s, "replay_s": replay_s} | {
        "plan": found["plan"]
    }


def print_demand(result: dict[str, Any]) -> None:
    print()
    print(
        f"scenario demand: a month of 10,000 leases on 200 hosts and {result['refusals']} "
        f"refused requests ({result['db']})"
    )
    rows = [
        [name, len(values), f"{statistics.median(values):.2f}", f"{max(values):.2f}"]
        for name, values in (
            ("GET /v1/demand (month)", result["report_s"]),
            (f"... with target={TARGET_PERCENT}", result["replay_s"]),
        )
    ]
    print(table(["", "n", "median s", "max s"], rows))
    plan = result["plan"]
    print(
        f"replay: {plan['extra_hosts']} extra host(s) admit {plan['admitted_requests']} of "
        f"{plan['counted_requests']} (with none, {plan['admitted_without_extra']})"
    )


def demand_targets(result: dict[str, Any]) -> list[Target]:
    plan = result["plan"]
    return [
        Target(
            f"demand: replay of a month for {TARGET_PERCENT}% (median)",
            statistics.median(result["replay_s"]),
            10,
            "s",
            note=f"{plan['extra_hosts']} extra hosts",
        )
    ]
