"""The two scenarios: lease admission over HTTP, and how late lease events are applied."""

from __future__ import annotations

import datetime as dt
import json
import random
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.server import RunningServer
from bench.stats import percentile, summary
from bench.targets import Target

HTTP_TIMEOUT = 60.0
EVENT_LAG_GOAL_MS = 100.0
"""Issue 3: with 1,000 leases starting together, every start and end event applied within
100 ms of its time (p99, and none later)."""
RSS_GOAL_MB = 300.0


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(value: dt.datetime) -> str:
    """ISO 8601 with an explicit offset, one of the date forms the API accepts."""
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds")


def host_body(i: int, pool: str) -> dict[str, Any]:
    return {
        "name": f"{pool}-host-{i:05d}",
        "vcpus": 64,
        "memory_mb": 262144,
        "local_gb": 1800,
        "hypervisor_type": "QEMU",
        "rack": f"r{i % 16:02d}",
        "gpu": "true" if i % 10 == 0 else "false",
    }


def lease_body(
    name: str, start: dt.datetime, end: dt.datetime, *, rack: int | None = None
) -> dict[str, Any]:
    """A one-host lease; with ``rack``, on a host of that rack (``host_body``)."""
    where = "" if rack is None else json.dumps(["==", "$rack", f"r{rack:02d}"])
    return {
        "name": name,
        "start_date": iso(start),
        "end_date": iso(end),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                "hypervisor_properties": "",
                "resource_properties": where,
            }
        ],
        "events": [],
    }


def create_hosts(client: httpx.Client, count: int, pool: str) -> dict[str, Any]:
    latencies: list[float] = []
    began = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        response = client.post("/v1/os-hosts", json=host_body(i, pool))
        latencies.append((time.perf_counter() - t0) * 1000.0)
        if response.status_code != 201:
            raise RuntimeError(f"creating host {i}: HTTP {response.status_code} {response.text}")
    elapsed = time.perf_counter() - began
    return {
        "count": count,
        "seconds": elapsed,
        "per_second": count / elapsed if elapsed else 0.0,
        "latency_ms": summary(latencies),
    }


# -- scenario "create" ---------------------------------------------------------------------------

REFUSED_RATIO_GOAL = 2.0
"""A refused request's p50 at most this many times an admitted one's (issue: refusals as fast
as admissions)."""
REFUSED_P99_GOAL_MS = 50.0


def create_targets(result: dict[str, Any]) -> list[Target]:
    """What a refusal costs against an admission, in the contended sequential run."""
    lat = result["latency_ms"]
    admitted, refused = lat["admitted"], lat["refused"]
    if not refused["count"] or not admitted["count"]:
        return []
    note = f"{refused['count']} refused of {refused['count'] + admitted['count']} requests"
    return [
        Target(
            "HTTP refused p50 / admitted p50",
            refused["median"] / admitted["median"],
            REFUSED_RATIO_GOAL,
            "x",
            note=f"{refused['median']:.1f} / {admitted['median']:.1f} ms; {note}",
        ),
        Target("HTTP refused p99", refused["p99"], REFUSED_P99_GOAL_MS, "ms", note=note),
    ]


@dataclass(frozen=True)
class CreateConfig:
    hosts: int
    leases: int
    horizon_days: float
    load: float
    seed: int

    @property
    def mean_duration(self) -> dt.timedelta:
        """Mean lease length that makes the average demand ``load`` x the host count."""
        days = self.load * self.hosts * self.horizon_days / max(self.leases, 1)
        return dt.timedelta(days=days)


def lease_windows(config: CreateConfig, now: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    """Random windows: starts uniform over the horizon, lengths uniform in 0.25..1.75 x mean."""
    rng = random.Random(config.seed)
    horizon = config.horizon_days * 86400.0
    mean = config.mean_duration.total_seconds()
    windows = []
    for _ in range(config.leases):
        start = now + dt.timedelta(seconds=rng.uniform(120.0, horizon))
        length = max(rng.uniform(0.25 * mean, 1.75 * mean), 60.0)
        windows.append((start, start + dt.timedelta(seconds=length)))
    return windows


def run_create(
    server: RunningServer,
    config: CreateConfig,
    *,
    around_leases: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> dict[str, Any]:
    """Create the hosts, then the leases one by one; time each lease POST on the client."""
    run = uuid.uuid4().hex[:6]
    with httpx.Client(base_url=server.base_url, timeout=HTTP_TIMEOUT) as client:
        hosts = create_hosts(client, config.hosts, f"bench{run}")
        windows = lease_windows(config, utc_now())
        latencies: list[float] = []
        outcomes: list[str] = []
        other_errors: Counter[str] = Counter()
        with around_leases():
            began = time.perf_counter()
            for i, (start, end) in enumerate(windows):
                body = lease_body(f"bench-{run}-{i:06d}", start, end)
                t0 = time.perf_counter()
                response = client.post("/v1/leases", json=body)
                latencies.append((time.perf_counter() - t0) * 1000.0)
                if response.status_code == 201:
                    outcomes.append("admitted")
                elif response.status_code == 409 and "reason" in _error(response):
                    outcomes.append("refused")
                else:
                    outcomes.append("error")
                    other_errors[
                        f"{response.status_code} {_error(response).get('error_message')}"
                    ] += 1
            elapsed = time.perf_counter() - began
    counts = Counter(outcomes)
    tenth = max(len(latencies) // 10, 1)

    def pick(kind: str) -> list[float]:
        return [lat for lat, o in zip(latencies, outcomes, strict=True) if o == kind]

    return {
        "config": {
            "hosts": config.hosts,
            "leases": config.leases,
            "horizon_days": config.horizon_days,
            "load": config.load,
            "mean_duration_hours": config.mean_duration.total_seconds() / 3600.0,
            "seed": config.seed,
        },
        "hosts": hosts,
        "admitted": counts["admitted"],
        "refused": counts["refused"],
        "errors": counts["error"],
        "error_kinds": dict(other_errors),
        "seconds": elapsed,
        "leases_per_second": len(latencies) / elapsed if elapsed else 0.0,
        "latency_ms": {
            "all": summary(latencies),
            "admitted": summary(pick("admitted")),
            "refused": summary(pick("refused")),
            "first_10pct": summary(latencies[:tenth]),
            "last_10pct": summary(latencies[-tenth:]),
            "median_by_tenth": [
                percentile(latencies[i * tenth : (i + 1) * tenth], 50)
                for i in range(min(10, len(latencies)))
            ],
        },
    }


def _error(response: httpx.Response) -> dict[str, Any]:
    """An error body (a capacity refusal explains itself with ``reason``), or {}."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


# -- scenario "events" ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EventsConfig:
    leases: int
    hosts: int
    duration_seconds: float
    lead_seconds: float | None
    """Seconds from now to the common start; None: estimate from a calibration."""
    settle_seconds: float


@dataclass(frozen=True)
class EventRow:
    lease_id: str
    event_type: str
    status: str
    time: dt.datetime
    done_at: dt.datetime | None


def _as_utc(value: object) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    assert isinstance(value, dt.datetime)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class EventReader:
    """Read-only access to the server's events table (SQLite file or PostgreSQL database)."""

    QUERY = "SELECT lease_id, event_type, status, time, done_at FROM events"

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if server.sqlite_path is not None:
            uri = f"file:{server.sqlite_path}?mode=ro"
            self._sqlite = sqlite3.connect(uri, uri=True, timeout=30)
        else:
            self._pg = psycopg.connect(server.database_url, autocommit=True)
            self._pg.read_only = True

    def rows(self, lease_ids: set[str]) -> list[EventRow]:
        if self._sqlite is not None:
            raw: Sequence[Sequence[Any]] = self._sqlite.execute(self.QUERY).fetchall()
        else:
            assert self._pg is not None
            raw = self._pg.execute(self.QUERY).fetchall()
        found = []
        for lease_id, event_type, status, when, done_at in raw:
            if lease_id in lease_ids:
                time_utc = _as_utc(when)
                assert time_utc is not None
                found.append(EventRow(lease_id, event_type, status, time_utc, _as_utc(done_at)))
        return found

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()


def _calibrate(client: httpx.Client, samples: int = 5) -> float:
    """Seconds per lease creation, from a few leases a year out (deleted again)."""
    far = utc_now() + dt.timedelta(days=365)
    spent = 0.0
    for i in range(samples):
        start = far + dt.timedelta(days=i)
        body = lease_body(f"calibrate-{uuid.uuid4().hex[:8]}", start, start + dt.timedelta(hours=1))
        t0 = time.perf_counter()
        response = client.post("/v1/leases", json=body)
        spent += time.perf_counter() - t0
        if response.status_code != 201:
            raise RuntimeError(f"calibration lease: HTTP {response.status_code} {response.text}")
        client.delete(f"/v1/leases/{response.json()['lease']['id']}").raise_for_status()
    return spent / samples


def run_events(
    server: RunningServer,
    config: EventsConfig,
    *,
    around_wait: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> dict[str, Any]:
    """N leases starting together a little in the future; measure done_at - time per event."""
    run = uuid.uuid4().hex[:6]
    with httpx.Client(base_url=server.base_url, timeout=HTTP_TIMEOUT) as client:
        hosts = create_hosts(client, config.hosts, f"ev{run}")
        per_lease = _calibrate(client)
        lead = config.lead_seconds
        if lead is None:
            lead = 3.0 + 2.0 * per_lease * config.leases
        start = (utc_now() + dt.timedelta(seconds=lead)).replace(microsecond=0)
        start += dt.timedelta(seconds=1)
        end = start + dt.timedelta(seconds=config.duration_seconds)
        lease_ids: set[str] = set()
        refused = 0
        for i in range(config.leases):
            response = client.post("/v1/leases", json=lease_body(f"ev-{run}-{i:05d}", start, end))
            if response.status_code == 201:
                lease_ids.add(response.json()["lease"]["id"])
            elif response.status_code == 409:
                refused += 1
            else:
                raise RuntimeError(f"lease {i}: HTTP {response.status_code} {response.text}")
        created_at = utc_now()
        margin = (start - created_at).total_seconds()
        reader = EventReader(server)
        try:
            with around_wait():
                rows = _wait_for_events(reader, lease_ids, end, config.settle_seconds)
        finally:
            reader.close()
        # The high-water mark since the server started: everything above, events included.
        rss = process_memory_mb(server.pid)
        statuses = Counter(
            lease["status"]
            for lease in client.get("/v1/leases").json()["leases"]
            if lease["id"] in lease_ids
        )
    result: dict[str, Any] = {
        "config": {
            "leases": config.leases,
            "hosts": config.hosts,
            "duration_seconds": config.duration_seconds,
            "lead_seconds": lead,
            "calibrated_seconds_per_lease": per_lease,
        },
        "hosts": hosts,
        "admitted": len(lease_ids),
        "refused": refused,
        "start_time": iso(start),
        "end_time": iso(end),
        "created_before_start_seconds": margin,
        "lag_ms": _lags(rows),
        "event_status": dict(Counter(r.status for r in rows)),
        "lease_status": dict(statuses),
        "server_rss_mb": rss,
    }
    result["targets"] = [t.as_dict() for t in events_targets(result)]
    return result


def _wait_for_events(
    reader: EventReader, lease_ids: set[str], end: dt.datetime, settle: float
) -> list[EventRow]:
    """Poll until every event of the leases is done (or failed), or ``settle`` s after the end."""
    deadline = end + dt.timedelta(seconds=settle)
    while True:
        rows = reader.rows(lease_ids)
        pending = [r for r in rows if r.status not in ("DONE", "ERROR")]
        if (rows and not pending and utc_now() > end) or utc_now() > deadline:
            return rows
        time.sleep(0.25)


def _lags(rows: list[EventRow]) -> dict[str, Any]:
    by_type: dict[str, list[float]] = {}
    for row in rows:
        if row.done_at is None:
            continue
        lag = (row.done_at - row.time).total_seconds() * 1000.0
        by_type.setdefault(row.event_type, []).append(lag)
        by_type.setdefault("all", []).append(lag)
    result: dict[str, Any] = {}
    for kind in ("start_lease", "before_end_lease", "end_lease", "all"):
        values = by_type.get(kind, [])
        stats = summary(values)
        stats["late_over_100ms"] = sum(1 for v in values if v > EVENT_LAG_GOAL_MS)
        stats["late_over_1s"] = sum(1 for v in values if v > 1000.0)
        stats["not_done"] = sum(
            1 for r in rows if r.done_at is None and kind in (r.event_type, "all")
        )
        result[kind] = stats
    return result


def process_memory_mb(pid: int) -> dict[str, float | None]:
    """Peak (``VmHWM``, the high-water mark since the process started) and current (``VmRSS``)
    resident memory of a process, in MB, from ``/proc/<pid>/status``; None where unreadable."""
    found: dict[str, float | None] = {"peak": None, "current": None}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            found["peak" if key == "VmHWM" else "current"] = int(value.split()[0]) / 1024.0
    return found


def events_targets(result: dict[str, Any]) -> list[Target]:
    """Issue 3's event-lag target for a run of the ``events`` scenario: start and end events
    each with a p99 lag of at most 100 ms and none later (an event never done counts as late),
    and the server's peak memory."""
    leases = result["config"]["leases"]
    lag = result["lag_ms"]
    late = sum(
        lag[kind]["late_over_100ms"] + lag[kind]["not_done"]
        for kind in ("start_lease", "end_lease")
    )
    note = f"{leases} leases starting together"
    if result["created_before_start_seconds"] <= 0:
        note += "; creation overran the start: lags not meaningful"

    def measured(kind: str) -> float | None:
        value = lag[kind]["p99"]
        return None if lag[kind]["count"] == 0 or value != value else float(value)

    return [
        Target(
            "event lag p99, start_lease",
            measured("start_lease"),
            EVENT_LAG_GOAL_MS,
            "ms",
            note=note,
        ),
        Target(
            "event lag p99, end_lease", measured("end_lease"), EVENT_LAG_GOAL_MS, "ms", note=note
        ),
        Target(
            "start/end events later than 100 ms",
            float(late),
            0,
            "events",
            note="not done counts as late",
        ),
        Target(
            "climate serve peak RSS (API + manager)",
            result["server_rss_mb"]["peak"],
            RSS_GOAL_MB,
            "MB",
            note="VmHWM at the end of the scenario",
        ),
    ]
