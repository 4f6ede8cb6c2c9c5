"""Sustained create/delete throughput with C concurrent clients, and how it scales with processes.

Each client is a thread with its own keep-alive connection (``http.client``: the lightest client
the standard library has, so that the clients leave the CPU to the server under test). First the
C clients create one-host leases somewhere in the next year until the time is up (creates/s);
then the same clients delete every lease they made (deletes/s). The
server is ``climate serve`` on SQLite (the embedded default), or ``climate api --workers N`` on
PostgreSQL: N API processes against one database, no manager (these leases start far ahead).
Each client asks for hosts of its own rack (``rack`` r00 to r15): requests spread over disjoint
host pools, which per-resource locking admits side by side. On PostgreSQL a sampler reads
``pg_stat_activity`` every 50 ms while the clients create: the share of the service's busy
backends that wait on a lock (``wait_event_type = 'Lock'``).
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.scenarios import create_hosts, lease_body, utc_now
from bench.server import DEFAULT_PG_ADMIN_URL, climate_server
from bench.stats import percentile, table
from bench.targets import Target

CREATES_GOAL = 300.0
SCALING_GOAL = 1.0
"""PostgreSQL, 4 API processes over 1 on the 2-core machine: no lower (issue 17)."""
LOCK_WAIT_GOAL = 10.0
"""PostgreSQL, 4 API processes: % of busy backend samples waiting on a lock."""
RACKS = 16
SAMPLE_SECONDS = 0.05


@dataclass
class _Tally:
    latencies: list[float] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    refused: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _connect(base_url: str) -> http.client.HTTPConnection:
    parts = urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)


def _creator(base_url: str, seconds: float, index: int, tally: _Tally) -> None:
    conn = _connect(base_url)
    rng = random.Random(index)
    now = utc_now() + dt.timedelta(days=1)
    headers = {"Content-Type": "application/json"}
    deadline = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < deadline:
        n += 1
        start = now + dt.timedelta(minutes=rng.randrange(0, 365 * 24 * 60))
        end = start + dt.timedelta(minutes=rng.randrange(30, 240))
        body = json.dumps(lease_body(f"t{index}-{n}", start, end, rack=index % RACKS))
        began = time.perf_counter()
        conn.request("POST", "/v1/leases", body, headers)
        response = conn.getresponse()
        payload = response.read()
        elapsed = (time.perf_counter() - began) * 1000
        if response.status == 201:
            tally.latencies.append(elapsed)
            tally.created.append(json.loads(payload)["lease"]["id"])
        elif response.status == 409:
            tally.refused += 1
        else:
            tally.error(f"POST {response.status}")
    conn.close()


def _deleter(base_url: str, lease_ids: list[str], tally: _Tally) -> None:
    conn = _connect(base_url)
    for lease_id in lease_ids:
        began = time.perf_counter()
        conn.request("DELETE", f"/v1/leases/{lease_id}")
        response = conn.getresponse()
        response.read()
        if response.status == 204:
            tally.latencies.append((time.perf_counter() - began) * 1000)
        else:
            tally.error(f"DELETE {response.status}")
    conn.close()


def _run(threads: list[threading.Thread]) -> float:
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def _merged(tallies: list[_Tally]) -> tuple[list[float], dict[str, int]]:
    latencies = [x for t in tallies for x in t.latencies]
    errors: dict[str, int] = {}
    for t in tallies:
        for kind, count in t.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    return latencies, errors


class _LockWaits:
    """Samples the database's backends (but its own) while the clients create: how many are
    busy (``active``) and how many of those wait on a heavyweight lock."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._stop = threading.Event()
        self.busy = 0
        self.waiting = 0
        self.by_event: dict[str, int] = {}
        self._thread = threading.Thread(target=self._sample, name="lock-waits")

    def __enter__(self) -> _LockWaits:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psycopg

        with psycopg.connect(self._url.replace("postgresql+psycopg", "postgresql")) as conn:
            conn.autocommit = True
            while not self._stop.wait(SAMPLE_SECONDS):
                rows = conn.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND state = 'active'"
                ).fetchall()
                for kind, event in rows:
                    self.busy += 1
                    if kind == "Lock":
                        self.waiting += 1
                        self.by_event[event] = self.by_event.get(event, 0) + 1

    @property
    def percent(self) -> float | None:
        return 100.0 * self.waiting / self.busy if self.busy else None


def measure(
    base_url: str, clients: int, seconds: float, database_url: str | None = None
) -> dict[str, Any]:
    """C clients create leases for ``seconds``; then the same clients delete them all. With a
    PostgreSQL ``database_url``, lock waits are sampled while they create."""
    made = [_Tally() for _ in range(clients)]
    creators = [
        threading.Thread(target=_creator, args=(base_url, seconds, i, made[i]))
        for i in range(clients)
    ]
    waits: _LockWaits | None = None
    if database_url is not None and database_url.startswith("postgresql"):
        with _LockWaits(database_url) as waits:
            create_wall = _run(creators)
    else:
        create_wall = _run(creators)
    gone = [_Tally() for _ in range(clients)]
    delete_wall = _run(
        [
            threading.Thread(target=_deleter, args=(base_url, made[i].created, gone[i]))
            for i in range(clients)
        ]
    )
    creates, create_errors = _merged(made)
    deletes, delete_errors = _merged(gone)
    return {
        "clients": clients,
        "seconds": create_wall,
        "creates": len(creates),
        "deletes": len(deletes),
        "refused": sum(t.refused for t in made),
        "errors": {**create_errors, **delete_errors},
        "creates_per_second": len(creates) / create_wall,
        "deletes_per_second": len(deletes) / delete_wall if deletes else 0.0,
        "create_p50_ms": percentile(creates, 50) if creates else None,
        "create_p99_ms": percentile(creates, 99) if creates else None,
        "delete_p50_ms": percentile(deletes, 50) if deletes else None,
        "lock_wait_percent": waits.percent if waits is not None else None,
        "lock_waits_by_event": waits.by_event if waits is not None else {},
        "busy_samples": waits.busy if waits is not None else 0,
    }


def run_throughput(
    db: str,
    *,
    api_workers: int = 0,
    clients: int = 8,
    seconds: float = 15.0,
    hosts: int = 100,
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL,
) -> dict[str, Any]:
    with climate_server(db, pg_admin_url=pg_admin_url, api_workers=api_workers) as server:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            create_hosts(client, hosts, "tp")
            warm = client.post(
                "/v1/leases",
                json=lease_body(
                    "warm", utc_now() + dt.timedelta(days=400), utc_now() + dt.timedelta(days=401)
                ),
            )
            warm.raise_for_status()
        result = measure(server.base_url, clients, seconds, server.database_url)
    processes = f"{api_workers} API processes" if api_workers else "climate serve"
    result.update({"db": db, "processes": processes, "api_workers": max(api_workers, 1)})
    return result


def run_all(
    clients: int, seconds: float, pg_admin_url: str = DEFAULT_PG_ADMIN_URL
) -> dict[str, Any]:
    """The embedded default, then PostgreSQL with one and with four API processes."""
    return {
        "sqlite": run_throughput("sqlite", clients=clients, seconds=seconds),
        "pg_1": run_throughput(
            "postgresql", api_workers=1, clients=clients, seconds=seconds, pg_admin_url=pg_admin_url
        ),
        "pg_4": run_throughput(
            "postgresql", api_workers=4, clients=clients, seconds=seconds, pg_admin_url=pg_admin_url
        ),
    }


def throughput_targets(results: dict[str, Any]) -> list[Target]:
    one, four = results["pg_1"]["creates_per_second"], results["pg_4"]["creates_per_second"]
    return [
        Target(
            f"creates/s sustained, SQLite, {results['sqlite']['clients']} clients",
            results["sqlite"]["creates_per_second"],
            CREATES_GOAL,
            "/s",
            higher_is_better=True,
        ),
        Target(
            "PostgreSQL throughput, 4 API processes over 1",
            four / one if one else None,
            SCALING_GOAL,
            "x",
            higher_is_better=True,
            note=f"{one:.0f}/s -> {four:.0f}/s",
        ),
        Target(
            "PostgreSQL, 4 API processes: busy backends waiting on a lock",
            results["pg_4"]["lock_wait_percent"],
            LOCK_WAIT_GOAL,
            "%",
            note=f"1 process: {_percent(results['pg_1']['lock_wait_percent'])}",
        ),
    ]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def print_throughput(results: dict[str, Any]) -> None:
    print()
    first = results["sqlite"]
    print(
        f"scenario throughput: {first['clients']} clients create one-host leases for "
        f"{first['seconds']:.0f} s, then delete them all"
    )
    rows: list[Sequence[object]] = []
    for r in results.values():
        rows.append(
            [
                f"{r['db']}, {r['processes']}",
                f"{r['creates_per_second']:.0f}",
                r["creates"],
                f"{r['deletes_per_second']:.0f}",
                r["refused"],
                r["errors"] or "",
                f"{r['create_p50_ms']:.1f}" if r["create_p50_ms"] else "-",
                f"{r['create_p99_ms']:.1f}" if r["create_p99_ms"] else "-",
                f"{r['delete_p50_ms']:.1f}" if r["delete_p50_ms"] else "-",
                _percent(r["lock_wait_percent"]),
                ", ".join(f"{k} {v}" for k, v in sorted(r["lock_waits_by_event"].items())),
            ]
        )
    print(
        table(
            (
                "server",
                "creates/s",
                "creates",
                "deletes/s",
                "409",
                "errors",
                "create p50",
                "p99",
                "delete p50",
                "lock waits",
                "by event",
            ),
            rows,
            indent="    ",
        )
    )
