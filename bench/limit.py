"""Scenario ``limit``: Climate's admission against the framework's floor, in one run.

The floor (``bench/floor_app.py``) is a minimal FastAPI app on the same uvicorn, uvloop and
httptools, doing one indexed SQLite read and one insert per request. Both servers run at once
and get the same number of requests from one sequential client, interleaved in small batches so
that the machine's load falls on both alike. Reported: p50 latency and server CPU per request,
and Climate's as a ratio to the floor's (issue 17: at most 2x the p50, 3x the CPU).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.scenarios import create_hosts, lease_body
from bench.server import climate_server, cpu_seconds, free_port, written_bytes
from bench.stats import summary, table
from bench.targets import Target

P50_GOAL = 2.0
CPU_GOAL = 3.0
READY_TIMEOUT = 30.0
REPO = Path(__file__).resolve().parent.parent
STATEMENT_SAMPLE = 100
"""Admissions whose SQL statements are counted, in process (``statements_per_admission``)."""


@dataclass(frozen=True)
class LimitConfig:
    requests: int = 1000
    batch: int = 50
    warmup: int = 100
    hosts: int = 100
    seed: int = 17


def statements_per_admission(hosts: int, admissions: int, seed: int) -> tuple[float, float]:
    """SQL statements SQLite runs per lease admitted through the service in this process, on a
    fresh database with ``hosts`` hosts, BEGIN and COMMIT included, each row of a batch insert
    counted; then the trigger programs those statements ran (``counted``)."""
    from sqlalchemy import event

    from climate.api.schemas import validated
    from climate.api.schemas.leases import LeaseCreate
    from climate.config import load_settings
    from climate.db import migrate
    from climate.db.engine import Database
    from climate.domain.actor import Actor
    from climate.runtime import build_context
    from climate.services.hosts import HostService
    from climate.services.leases import LeaseService

    admin = Actor("admin", "admin", frozenset({"admin"}))
    with tempfile.TemporaryDirectory(prefix="climate-limit-") as tmp:
        db = Database(f"sqlite:///{tmp}/climate.db")
        migrate.upgrade(db)
        db.engine.dispose()
        traced: list[str] = []
        counting = False

        @event.listens_for(db.engine, "connect")
        def _trace(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.set_trace_callback(lambda sql: counting and traced.append(sql))

        ctx = build_context(load_settings(env={}, data_dir=tmp), db)
        for i in range(hosts):
            HostService(ctx).create(admin, f"limit-{i}", {"vcpus": 32})
        service = LeaseService(ctx)
        bodies = _leases(random.Random(seed))
        counting = True
        for _ in range(admissions):
            service.create(admin, validated(LeaseCreate, next(bodies)).request())
        counting = False
        db.dispose()
    statements, triggers = counted(traced)
    return statements / admissions, triggers / admissions


def counted(traced: Sequence[str]) -> tuple[int, int]:
    """Statements and trigger programs in what SQLite's trace callback saw: Python's callback
    gives a trigger program's start the text of the statement that fired it (with its values),
    so a repeat of the entry before it is a trigger program, not a statement."""
    statements = sum(1 for i, sql in enumerate(traced) if i == 0 or sql != traced[i - 1])
    return statements, len(traced) - statements


@contextlib.contextmanager
def floor_server() -> Iterator[tuple[str, int]]:
    """The floor app under uvicorn on a free port, on a throwaway SQLite file."""
    with tempfile.TemporaryDirectory(prefix="climate-floor-") as tmp:
        port = free_port()
        log = Path(tmp, "floor.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.floor_app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            env={**os.environ, "CLIMATE_FLOOR_DB": str(Path(tmp, "floor.db"))},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the floor app exited with {proc.returncode}")
                try:
                    httpx.get(f"{base_url}/docs", timeout=1.0)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the floor app did not answer") from None
                    time.sleep(0.1)
            yield base_url, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()


class _Side:
    """One server: its client, its request bodies and what it measured."""

    def __init__(self, base_url: str, pid: int, path: str, bodies: Iterator[dict[str, Any]]):
        self.client = httpx.Client(base_url=base_url, timeout=60)
        self.pid = pid
        self.path = path
        self.bodies = bodies
        self.latencies_ms: list[float] = []
        self.codes: dict[int, int] = {}
        self.cpu = 0.0
        self.written = 0

    def run(self, count: int, *, measure: bool = True) -> None:
        before, written = cpu_seconds(self.pid), written_bytes(self.pid)
        for _ in range(count):
            body = next(self.bodies)
            began = time.perf_counter()
            response = self.client.post(self.path, json=body)
            elapsed = (time.perf_counter() - began) * 1000.0
            if measure:
                self.codes[response.status_code] = self.codes.get(response.status_code, 0) + 1
                if response.status_code == 201:
                    self.latencies_ms.append(elapsed)
        if measure:
            self.cpu += cpu_seconds(self.pid) - before
            self.written += written_bytes(self.pid) - written

    def figures(self) -> dict[str, Any]:
        done = sum(self.codes.values())
        return {
            "latency_ms": summary(self.latencies_ms),
            "codes": self.codes,
            "cpu_ms_per_request": self.cpu * 1000.0 / done if done else None,
            "kb_written_per_request": self.written / 1024.0 / done if done else None,
        }


def _leases(rng: random.Random) -> Iterator[dict[str, Any]]:
    base = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    i = 0
    while True:
        start = base + dt.timedelta(hours=rng.uniform(0, 24 * 365))
        end = start + dt.timedelta(hours=rng.uniform(1, 12))
        yield lease_body(f"limit-{i}", start, end)
        i += 1


def _bookings(rng: random.Random) -> Iterator[dict[str, Any]]:
    i = 0
    while True:
        yield {
            "name": f"floor-{i}",
            "resource": rng.randrange(100),
            "start": "2030-01-01T00:00:00+00:00",
            "end": "2030-01-01T01:00:00+00:00",
        }
        i += 1


def run_limit(config: LimitConfig = LimitConfig()) -> dict[str, Any]:
    rng = random.Random(config.seed)
    with floor_server() as (floor_url, floor_pid), climate_server("sqlite") as server:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            create_hosts(client, config.hosts, "limit")
        floor = _Side(floor_url, floor_pid, "/bookings", _bookings(rng))
        climate = _Side(server.base_url, server.pid, "/v1/leases", _leases(rng))
        for side in (floor, climate):
            side.run(config.warmup, measure=False)
        done = 0
        while done < config.requests:
            n = min(config.batch, config.requests - done)
            floor.run(n)
            climate.run(n)
            done += n
        for side in (floor, climate):
            side.client.close()
    statements, triggers = statements_per_admission(config.hosts, STATEMENT_SAMPLE, config.seed)
    return {
        "config": config.__dict__,
        "floor": floor.figures(),
        "climate": climate.figures(),
        "statements_per_admission": statements,
        "trigger_programs_per_admission": triggers,
    }


def _ratio(result: dict[str, Any], key: str) -> float | None:
    floor, climate = result["floor"], result["climate"]
    if key == "p50":
        low, high = floor["latency_ms"]["median"], climate["latency_ms"]["median"]
    else:
        low, high = floor["cpu_ms_per_request"], climate["cpu_ms_per_request"]
    if not low or high is None:
        return None
    return float(high / low)


def limit_targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target("HTTP single-host admission p50 / floor p50", _ratio(result, "p50"), P50_GOAL, "x"),
        Target("server CPU per admission / floor's", _ratio(result, "cpu"), CPU_GOAL, "x"),
    ]


def print_limit(result: dict[str, Any]) -> None:
    c = result["config"]
    print()
    print(
        f"scenario limit: {c['requests']} requests to each server, interleaved in batches of "
        f"{c['batch']} after {c['warmup']} warm-up requests; one sequential client; Climate "
        f"(climate serve, SQLite) admits 1-host leases on {c['hosts']} hosts; the floor is "
        "bench/floor_app.py (FastAPI, uvicorn+uvloop+httptools, one indexed SQLite read + insert)"
    )
    rows = []
    for label in ("floor", "climate"):
        r = result[label]
        lat = r["latency_ms"]
        rows.append(
            [
                label,
                lat["count"],
                lat["median"],
                lat["p95"],
                lat["p99"],
                r["cpu_ms_per_request"],
                r["kb_written_per_request"],
                " ".join(f"{k}:{v}" for k, v in sorted(r["codes"].items())),
            ]
        )
    header = ("", "201s", "p50 ms", "p95 ms", "p99 ms", "CPU ms/request", "KB written/request")
    print(table((*header, "codes"), rows))
    p50, cpu = _ratio(result, "p50"), _ratio(result, "cpu")
    print(
        f"  Climate / floor: p50 {p50 if p50 is None else round(p50, 2)}x, "
        f"CPU {cpu if cpu is None else round(cpu, 2)}x"
    )
    print(
        f"  SQL statements per admission (SQLite's trace, through the service in process, "
        f"BEGIN and COMMIT included, each row of a batch): {result['statements_per_admission']:.1f}"
        f", and {result['trigger_programs_per_admission']:.1f} trigger programs they ran"
    )
