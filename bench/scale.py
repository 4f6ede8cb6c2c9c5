"""Admission at scale: H hosts, A existing future allocations, over HTTP and in the planner alone.

``python -m bench.scale --hosts 1000 --allocations 100000`` seeds a fresh database directly (bulk
SQL: creating 100,000 leases over HTTP would take the benchmark's whole budget), starts a real
``climate serve`` on it, and times lease creation through the API: single-host leases, and 8-host
leases filtered on a property, and reservations of 4 instances (8 vCPU / 32 GiB / 100 GB each).
The planner alone (calendar view and host choice, no HTTP, no SQL)
is timed in-process on the same data before the server starts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import insert

from bench.server import climate_server, rss_mb
from bench.stats import percentile, table
from bench.targets import Target

T0 = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
"""Seeded allocations start here, safely in the future."""
GPU_SHARE = 4
"""Every 4th host has gpu=a100."""


def seed(database_url: str, hosts: int, allocations: int, seed_value: int = 7) -> dt.datetime:
    """Hosts with properties, and ``allocations`` back-to-back-ish one-host leases spread over
    them; returns the end of the seeded horizon."""
    from climate.db import migrate
    from climate.db.engine import Database
    from climate.db.tables import Host, HostAllocation, HostProperty, Lease, Reservation

    db = Database(database_url)
    migrate.upgrade(db)
    rng = random.Random(seed_value)
    per_host = max(allocations // max(hosts, 1), 0)
    leases: list[dict[str, Any]] = []
    reservations: list[dict[str, Any]] = []
    spans: list[dict[str, Any]] = []
    horizon = T0
    params = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}
    for host_id in range(1, hosts + 1):
        cursor = T0 + dt.timedelta(hours=rng.uniform(0, 24))
        for _ in range(per_host):
            start = cursor
            end = start + dt.timedelta(hours=rng.uniform(2, 48))
            lease_id, reservation_id = str(uuid.uuid4()), str(uuid.uuid4())
            leases.append(
                {
                    "id": lease_id,
                    "name": lease_id[:13],
                    "project_id": "seed",
                    "user_id": "seed",
                    "start_date": start,
                    "end_date": end,
                    "status": "PENDING",
                    "created_at": T0,
                    "degraded": False,
                }
            )
            reservations.append(
                {
                    "id": reservation_id,
                    "lease_id": lease_id,
                    "resource_type": "physical:host",
                    "resource_id": reservation_id,
                    "status": "pending",
                    "params": params,
                    "created_at": T0,
                    "missing_resources": False,
                    "resources_changed": False,
                }
            )
            spans.append(
                {
                    "id": str(uuid.uuid4()),
                    "reservation_id": reservation_id,
                    "lease_id": lease_id,
                    "host_id": host_id,
                    "start_date": start,
                    "end_date": end,
                }
            )
            cursor = end + dt.timedelta(hours=rng.uniform(1, 48))
        horizon = max(horizon, cursor)
    with db.transaction() as session:
        session.execute(
            insert(Host),
            [
                {
                    "id": i,
                    "hypervisor_hostname": f"node-{i}",
                    "service_name": f"node-{i}",
                    "created_at": T0,
                    "reservable": True,
                    "vcpus": 64,
                    "memory_mb": 262144,
                    "local_gb": 1800,
                }
                for i in range(1, hosts + 1)
            ],
        )
        session.execute(
            insert(HostProperty),
            [
                {"host_id": i, "name": "gpu", "value": "a100" if i % GPU_SHARE == 0 else "none"}
                for i in range(1, hosts + 1)
            ],
        )
        for chunk in range(0, len(leases), 20_000):
            session.execute(insert(Lease), leases[chunk : chunk + 20_000])
            session.execute(insert(Reservation), reservations[chunk : chunk + 20_000])
            session.execute(insert(HostAllocation), spans[chunk : chunk + 20_000])
    db.dispose()
    return horizon


def planner_only(
    database_url: str, horizon: dt.datetime, samples: int, count: int = 1, query: str = ""
) -> list[float]:
    """Milliseconds per decision for ``count`` hosts matching ``query``: calendar view of every
    matching host plus host choice, no SQL (the matching hosts are looked up once, as the
    inventory cache does)."""
    from climate.db.engine import ADMISSION_LOCK, Database
    from climate.errors import NotEnoughCapacity
    from climate.planner.hosts import HostDemand, choose_hosts
    from climate.resources.hosts import PhysicalHostType

    db = Database(database_url)
    host_type = PhysicalHostType()
    rng = random.Random(11)
    timings = []
    with db.transaction(lock=ADMISSION_LOCK) as session:
        hosts = host_type.inventory.matching(session, "", query)
        host_type.calendar.view(session, hosts, T0, T0 + dt.timedelta(hours=1))  # load
        span = (horizon - T0).total_seconds()
        for _ in range(samples):
            start = T0 + dt.timedelta(seconds=rng.uniform(0, span))
            end = start + dt.timedelta(hours=rng.uniform(1, 24))
            began = time.perf_counter()
            calendars = host_type.calendar.view(session, hosts, start, end)
            try:
                choose_hosts(HostDemand(start, end, count, count), calendars)
            except NotEnoughCapacity:
                pass
            timings.append((time.perf_counter() - began) * 1000)
        session.rollback()
    db.dispose()
    return timings


INSTANCES = {
    "resource_type": "virtual:instance",
    "amount": 4,
    "vcpus": 8,
    "memory_mb": 32768,
    "disk_gb": 100,
    "affinity": None,
    "resource_properties": "",
}
"""Four instances of 8 vCPU / 32 GiB / 100 GB, placed anywhere: the issue's instance case."""


def _lease(name: str, start: dt.datetime, end: dt.datetime, count: int, query: str) -> Any:
    if count == 0:
        return {
            "name": name,
            "start_date": start.isoformat(),
            "end_date": end.isoformat(),
            "reservations": [INSTANCES],
            "events": [],
        }
    return {
        "name": name,
        "start_date": start.isoformat(),
        "end_date": end.isoformat(),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "hypervisor_properties": "",
                "resource_properties": query,
            }
        ],
        "events": [],
    }


def http_admissions(
    base_url: str, horizon: dt.datetime, count: int, hosts: int, query: str, tag: str
) -> tuple[list[float], dict[int, int]]:
    rng = random.Random(hash(tag) & 0xFFFF)
    timings: list[float] = []
    codes: dict[int, int] = {}
    span = (horizon - T0).total_seconds()
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for i in range(count):
            start = T0 + dt.timedelta(seconds=rng.uniform(0, span))
            end = start + dt.timedelta(hours=rng.uniform(1, 12))
            body = _lease(f"{tag}-{i}", start, end, hosts, query)
            began = time.perf_counter()
            response = client.post("/v1/leases", json=body)
            timings.append((time.perf_counter() - began) * 1000)
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
    return timings, codes


def run_scale(hosts: int, allocations: int, requests: int = 200) -> dict[str, Any]:
    result: dict[str, Any] = {"hosts": hosts, "allocations": allocations}
    state: dict[str, Any] = {}

    def prepare(url: str) -> None:
        began = time.perf_counter()
        state["horizon"] = seed(url, hosts, allocations)
        result["seed_seconds"] = time.perf_counter() - began
        result["planner_ms"] = planner_only(url, state["horizon"], samples=200)

    with climate_server("sqlite", prepare=prepare) as server:
        horizon = state["horizon"]
        single, single_codes = http_admissions(server.base_url, horizon, requests, 1, "", "one")
        eight, eight_codes = http_admissions(
            server.base_url, horizon, max(requests // 2, 1), 8, '["==", "$gpu", "a100"]', "eight"
        )
        instances, instance_codes = http_admissions(
            server.base_url, horizon, max(requests // 2, 1), 0, "", "instances"
        )
        result["single_ms"], result["single_codes"] = single, single_codes
        result["eight_ms"], result["eight_codes"] = eight, eight_codes
        result["instance_ms"], result["instance_codes"] = instances, instance_codes
        result["rss_mb"] = rss_mb(server.pid, "VmHWM")
    return result


def scale_targets(result: dict[str, Any]) -> list[Target]:
    hosts, allocations = result["hosts"], result["allocations"]
    at = f"H={hosts:,} A={allocations:,}"
    return [
        Target(f"HTTP single-host p50, {at}", percentile(result["single_ms"], 50), 5, "ms"),
        Target(f"HTTP single-host p99, {at}", percentile(result["single_ms"], 99), 25, "ms"),
        Target(f"HTTP 8-host+property p50, {at}", percentile(result["eight_ms"], 50), 10, "ms"),
        Target(f"planner-only p50, {at}", percentile(result["planner_ms"], 50), 1, "ms"),
        Target(f"API+manager peak RSS, {at}", result["rss_mb"], 300, "MB"),
    ]


def print_scale(result: dict[str, Any]) -> None:
    rows = []
    for label, key in (
        ("single-host", "single_ms"),
        ("8-host gpu", "eight_ms"),
        ("4 instances", "instance_ms"),
        ("planner only", "planner_ms"),
    ):
        values = result[key]
        rows.append(
            [
                label,
                len(values),
                percentile(values, 50),
                percentile(values, 95),
                percentile(values, 99),
                max(values),
            ]
        )
    print(
        f"scale: H={result['hosts']:,} hosts, A={result['allocations']:,} allocations "
        f"(seeded in {result['seed_seconds']:.1f} s)"
    )
    print(table(["", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"], rows))
    print(
        f"  status codes: single {result['single_codes']}, 8-host {result['eight_codes']}, "
        f"instances {result['instance_codes']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--allocations", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    result = run_scale(args.hosts, args.allocations, args.requests)
    print_scale(result)
    print(
        table(
            ["target", "measured", "goal", "verdict", "note"],
            [t.row() for t in scale_targets(result)],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
