"""The dashboard at scale: ``GET /v1/timeline`` for H hosts and L leases over a month, and the
page drawing it in Chromium.

``python -m bench --scenario ui`` seeds a fresh SQLite database directly (bulk SQL, as
``bench.scale`` does) with 1,000 hosts and 10,000 one-host leases of 20 projects spread over
the coming month, starts a real ``climate serve`` on it, then:

- times ``GET /v1/timeline`` over the month (the whole answer read by the client), as the
  admin and as a member of one project (who gets the others' bookings as anonymous bars);
- opens ``/ui/#/timeline/720`` (a month around now) in Debian's Chromium through Playwright
  and times from navigation to the timeline drawn (the page marks ``data-state="drawn"`` on
  the next animation frame after vis-timeline's ``changed`` event): assets, data and drawing.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import statistics
import time
import uuid
from typing import Any

import httpx
from sqlalchemy import insert

from bench.server import climate_server, cpu_seconds
from bench.stats import percentile, table
from bench.targets import Target

CHROMIUM = "/usr/bin/chromium"
PROJECTS = 20
MONTH = dt.timedelta(days=31)


def seed(database_url: str, hosts: int, leases: int, start: dt.datetime) -> None:
    """``hosts`` hosts; ``leases`` one-host leases, as many on each host, back to back with
    gaps, from ``start`` on (all within the month for the defaults)."""
    from climate.db import migrate
    from climate.db.engine import Database
    from climate.db.tables import Host, HostAllocation, Lease, Reservation

    db = Database(database_url)
    migrate.upgrade(db)
    rng = random.Random(11)
    per_host = leases // hosts
    rows: dict[str, list[dict[str, Any]]] = {"leases": [], "reservations": [], "allocations": []}
    params = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}
    for host_id in range(1, hosts + 1):
        cursor = start + dt.timedelta(hours=rng.uniform(0, 12))
        for _ in range(per_host):
            end = cursor + dt.timedelta(hours=rng.uniform(6, 60))
            lease_id, reservation_id = str(uuid.uuid4()), str(uuid.uuid4())
            project = f"project-{rng.randrange(PROJECTS)}"
            rows["leases"].append(
                {
                    "id": lease_id,
                    "name": f"{project}-{lease_id[:8]}",
                    "project_id": project,
                    "user_id": "seed",
                    "start_date": cursor,
                    "end_date": end,
                    "status": "PENDING",
                    "created_at": start,
                    "degraded": False,
                }
            )
            rows["reservations"].append(
                {
                    "id": reservation_id,
                    "lease_id": lease_id,
                    "resource_type": "physical:host",
                    "resource_id": reservation_id,
                    "status": "pending",
                    "params": params,
                    "created_at": start,
                    "missing_resources": False,
                    "resources_changed": False,
                }
            )
            rows["allocations"].append(
                {
                    "id": str(uuid.uuid4()),
                    "reservation_id": reservation_id,
                    "lease_id": lease_id,
                    "host_id": host_id,
                    "start_date": cursor,
                    "end_date": end,
                }
            )
            cursor = end + dt.timedelta(hours=rng.uniform(1, 12))
    with db.transaction() as session:
        session.execute(
            insert(Host),
            [
                {
                    "id": i,
                    "hypervisor_hostname": f"node-{i:04d}",
                    "service_name": f"node-{i:04d}",
                    "created_at": start,
                    "reservable": True,
                }
                for i in range(1, hosts + 1)
            ],
        )
        session.execute(insert(Lease), rows["leases"])
        session.execute(insert(Reservation), rows["reservations"])
        session.execute(insert(HostAllocation), rows["allocations"])
    db.dispose()


def _timed_gets(
    base_url: str, pid: int, params: dict[str, str], headers: dict[str, str], samples: int
) -> tuple[list[float], dict[str, int]]:
    """Wall time of each answer on the client; ``cpu_ms`` in the counts: the server's CPU time
    per request (what the answer costs whatever else the machine runs)."""
    times = []
    counts: dict[str, int] = {}
    cpu = cpu_seconds(pid)
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as http:
        for _ in range(samples):
            began = time.perf_counter()
            response = http.get("/v1/timeline", params=params)
            body = response.json()
            times.append((time.perf_counter() - began) * 1000)
            response.raise_for_status()
            found = body["timeline"]
            counts = {
                "resources": len(found["resources"]),
                "bars": len(found["bars"]),
                "leases": len(found["leases"]),
                "bytes": len(response.content),
            }
    counts["cpu_ms"] = round((cpu_seconds(pid) - cpu) * 1000 / samples)
    return times, counts


def _draw_ms(base_url: str, runs: int) -> tuple[list[float], dict[str, str]]:
    from playwright.sync_api import sync_playwright

    times = []
    marks: dict[str, str] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, chromium_sandbox=False)
        try:
            for _ in range(runs):
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                began = time.perf_counter()
                page.goto(f"{base_url}/ui/#/timeline/720")
                page.wait_for_selector("#timeline[data-state=drawn]", timeout=60_000)
                times.append((time.perf_counter() - began) * 1000)
                timeline = page.locator("#timeline")
                marks = {
                    "bars": timeline.get_attribute("data-bars") or "",
                    "resources": timeline.get_attribute("data-resources") or "",
                    "data_and_draw_ms": timeline.get_attribute("data-draw-ms") or "",
                }
                page.close()
        finally:
            browser.close()
    return times, marks


def run_ui(hosts: int = 1000, leases: int = 10_000, samples: int = 20) -> dict[str, Any]:
    start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    result: dict[str, Any] = {"hosts": hosts, "leases": leases}

    def prepare(url: str) -> None:
        began = time.perf_counter()
        seed(url, hosts, leases, start)
        result["seed_seconds"] = time.perf_counter() - began

    window = {"start": start.isoformat(), "end": (start + MONTH).isoformat()}
    with climate_server("sqlite", prepare=prepare) as server:
        result["admin_ms"], result["admin_counts"] = _timed_gets(
            server.base_url, server.pid, window, {}, samples
        )
        member = {"X-Project-Id": "project-3", "X-User-Id": "u", "X-Roles": "member"}
        result["member_ms"], result["member_counts"] = _timed_gets(
            server.base_url, server.pid, window, member, samples
        )
        if shutil.which(CHROMIUM) is None:
            result["draw_ms"], result["draw_marks"] = [], {"missing": CHROMIUM}
        else:
            result["draw_ms"], result["draw_marks"] = _draw_ms(server.base_url, 3)
    return result


def ui_targets(result: dict[str, Any]) -> list[Target]:
    at = f"H={result['hosts']:,} L={result['leases']:,}, a month"
    draws = result["draw_ms"]
    return [
        Target(
            f"GET /v1/timeline p50 (admin), {at}", percentile(result["admin_ms"], 50), 200, "ms"
        ),
        Target(
            f"GET /v1/timeline server CPU per answer (admin), {at}",
            result["admin_counts"]["cpu_ms"],
            200,
            "ms",
            note="the server's own CPU time: what the answer costs on an idle machine",
        ),
        Target(
            f"GET /v1/timeline p50 (member), {at}", percentile(result["member_ms"], 50), 200, "ms"
        ),
        Target(
            f"page drawn in Chromium, median of {len(draws)}, {at}",
            statistics.median(draws) if draws else None,
            2000,
            "ms",
            note="navigation to timeline drawn: assets, data, vis-timeline",
        ),
    ]


def print_ui(result: dict[str, Any]) -> None:
    print(
        f"ui: {result['hosts']:,} hosts, {result['leases']:,} leases over a month "
        f"(seeded in {result['seed_seconds']:.1f} s)"
    )
    rows = []
    for label, key in (("admin", "admin_ms"), ("member", "member_ms"), ("page drawn", "draw_ms")):
        values = result[key]
        if values:
            rows.append([label, len(values), percentile(values, 50), max(values)])
    print(table(["", "n", "p50 ms", "max ms"], rows))
    print(f"  admin answer: {result['admin_counts']}")
    print(f"  member answer: {result['member_counts']}")
    print(f"  page: {result['draw_marks']}")
