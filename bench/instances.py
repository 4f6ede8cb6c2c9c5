"""Instance-reservation admission latency over HTTP: 500 hosts, 5,000 existing instance leases.

``python -m bench --scenario instances`` starts a real ``climate serve`` on a fresh SQLite
database, registers the hosts over HTTP (64 vCPU / 256 GiB / 1.8 TB each, one in four with
``gpu=a100``), books the existing instance leases over HTTP (1 to 4 instances of 2 to 16 vCPU,
4 to 64 GiB and 20 to 200 GB, affinity none, true or false, windows of 1 to 24 hours spread over
30 days, seeded), then times further instance leases of the same mix one after another.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

import httpx

from bench.scenarios import iso, utc_now
from bench.server import climate_server
from bench.stats import percentile, table

HORIZON = dt.timedelta(days=30)


def _host(i: int) -> dict[str, Any]:
    return {
        "name": f"node-{i:04d}",
        "vcpus": 64,
        "memory_mb": 262144,
        "local_gb": 1800,
        "gpu": "a100" if i % 4 == 0 else "none",
    }


def _lease(rng: random.Random, name: str, base: dt.datetime) -> dict[str, Any]:
    start = base + dt.timedelta(minutes=rng.randrange(0, int(HORIZON.total_seconds() // 60)))
    end = start + dt.timedelta(minutes=rng.randrange(60, 24 * 60))
    return {
        "name": name,
        "start_date": iso(start),
        "end_date": iso(end),
        "reservations": [
            {
                "resource_type": "virtual:instance",
                "amount": rng.randint(1, 4),
                "vcpus": rng.choice([2, 4, 8, 16]),
                "memory_mb": rng.choice([4096, 8192, 16384, 32768, 65536]),
                "disk_gb": rng.choice([20, 50, 100, 200]),
                "affinity": rng.choice([None, True, False]),
                "resource_properties": "",
            }
        ],
        "events": [],
    }


def run_instances(hosts: int = 500, existing: int = 5000, timed: int = 200) -> dict[str, Any]:
    rng = random.Random(5)
    base = utc_now() + dt.timedelta(days=1)
    with (
        climate_server("sqlite") as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        for i in range(hosts):
            client.post("/v1/os-hosts", json=_host(i)).raise_for_status()
        began = time.perf_counter()
        booked = 0
        for i in range(existing):
            response = client.post("/v1/leases", json=_lease(rng, f"seed-{i}", base))
            booked += response.status_code == 201
        seeding = time.perf_counter() - began
        timings: list[float] = []
        codes: dict[int, int] = {}
        for i in range(timed):
            body = _lease(rng, f"timed-{i}", base)
            t0 = time.perf_counter()
            response = client.post("/v1/leases", json=body)
            timings.append((time.perf_counter() - t0) * 1000)
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
    return {
        "hosts": hosts,
        "existing_requested": existing,
        "existing_admitted": booked,
        "seed_seconds": seeding,
        "latency_ms": timings,
        "codes": codes,
    }


def print_instances(result: dict[str, Any]) -> None:
    ms = result["latency_ms"]
    print()
    print(
        f"scenario instances: {result['hosts']} hosts, {result['existing_admitted']:,} of "
        f"{result['existing_requested']:,} instance leases admitted first "
        f"({result['seed_seconds']:.1f} s over HTTP)"
    )
    print(
        table(
            ("", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"),
            [
                [
                    "instance lease",
                    len(ms),
                    percentile(ms, 50),
                    percentile(ms, 95),
                    percentile(ms, 99),
                    max(ms),
                ]
            ],
            indent="    ",
        )
    )
    print(f"    status codes: {result['codes']}")
