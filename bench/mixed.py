"""Scenario ``mixed``: 32 concurrent clients of mixed traffic against one ``climate serve``.

A fresh ``climate serve`` (API and manager in one process, the embedded SQLite default unless
``--db postgresql``) gets ``hosts`` hosts, then the load client (``bench.mixed_client``) runs in
a process of its own for ``seconds``: creations (whole hosts and instances), lists, gets,
updates, deletes, availability searches, allocation lists and timelines, with more creations than
deletions so that the database grows as it runs. Meanwhile this process samples the server once
a second: resident memory and CPU time from ``/proc/<pid>``, and the database's size. It
reports, per operation, latency percentiles and status codes; per time slice, requests/s,
creations/s, the creation median, the server's CPU use, RSS and database size (does throughput
fall as the database grows?); and the targets: no 5xx, no request left without an answer, and,
informational until the admission issue sets them, the figures issue 16 measured on bc8738b.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench.mixed_client import WEIGHTS
from bench.scenarios import RSS_GOAL_MB, create_hosts
from bench.server import (
    DEFAULT_PG_ADMIN_URL,
    RunningServer,
    checkout,
    climate_server,
    cpu_seconds,
    rss_mb,
)
from bench.stats import fmt, percentile, summary, table
from bench.targets import Target

ROOT = Path(__file__).resolve().parent.parent
CREATES = ("create host lease", "create instance lease")
TODAY = "bc8738b (issue 16): "
BASELINE_REV = "bc8738b"
"""The commit issue 16 measured; issue 17's throughput goal is a ratio to it, in the same run."""
THROUGHPUT_GOAL = 5.0
"""Issue 17: requests/s at least 5x bc8738b's, both measured in one run of the benchmark."""
CREATE_P99_GOAL_MS = 250.0
"""Issue 17: lease creation p99 at most 250 ms under the mixed load."""
EDGE_SECONDS = 10.0
KEPT_GOAL = 0.9
"""Issue 17: no more than 10% of the requests/s lost from the first to the last 10 s."""


@dataclass(frozen=True)
class MixedConfig:
    clients: int = 32
    seconds: float = 60.0
    hosts: int = 300
    db: str = "sqlite"
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL
    workers: int = 1
    """API processes of ``climate serve`` (``--workers``)."""
    server_src: str | None = None
    """Another checkout's ``src`` to run the server from (``bench.server.checkout``)."""

    @property
    def slice_seconds(self) -> float:
        """Twelve slices (5 s in a 60 s run), none shorter than a second."""
        return max(1.0, self.seconds / 12)


QUICK = MixedConfig(seconds=10.0, hosts=100)
"""A smoke run: the same mix for 10 s on 100 hosts."""


@dataclass(frozen=True)
class Sample:
    at: float
    """Seconds since the load began."""
    rss_mb: float | None
    cpu_seconds: float | None
    """User + system CPU time of the server since it started."""
    db_mb: float | None


def _db_mb(server: RunningServer) -> float | None:
    """The SQLite file with its write-ahead log, or the PostgreSQL database's size."""
    if server.sqlite_path is not None:
        paths = [server.sqlite_path, server.sqlite_path.with_name(server.sqlite_path.name + "-wal")]
        return sum(p.stat().st_size for p in paths if p.exists()) / 1e6
    with psycopg.connect(server.database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return None if row is None else int(row[0]) / 1e6


RouteCounts = dict[str, tuple[float, float]]
"""Per route (``METHOD /template``): worker CPU seconds and requests, since the server began."""


def _route_counts(server: RunningServer) -> RouteCounts | None:
    """The server's ``climate_http_route_cpu_seconds`` and requests by route (None: a server
    that does not count them, as the baseline's)."""
    try:
        response = httpx.get(f"{server.base_url}/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:  # bc8738b, the throughput baseline, has no /metrics
        return None
    text = response.text
    cpu: dict[str, float] = {}
    requests: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = f"{sample.labels.get('method')} {sample.labels.get('route')}"
            if sample.name == "climate_http_route_cpu_seconds_total":
                cpu[key] = sample.value
            elif sample.name == "climate_http_requests_total":
                requests[key] += sample.value
    return {key: (seconds, requests[key]) for key, seconds in cpu.items()} or None


def _route_costs(before: RouteCounts | None, after: RouteCounts | None) -> dict[str, Any]:
    """Per route that answered between two scrapes: requests, and worker CPU ms per request."""
    if before is None or after is None:
        return {}
    costs = {}
    for key, (seconds, requests) in after.items():
        old_seconds, old_requests = before.get(key, (0.0, 0.0))
        if requests > old_requests:
            cpu_ms = (seconds - old_seconds) * 1000.0 / (requests - old_requests)
            costs[key] = {"requests": int(requests - old_requests), "cpu_ms": cpu_ms}
    return costs


def _sample(server: RunningServer, at: float) -> Sample:
    return Sample(at, rss_mb(server.pid), cpu_seconds(server.pid), _db_mb(server))


def _lease_count(server: RunningServer) -> int:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        found = 0
        marker = None
        while True:
            params = {"limit": "1000"} | ({} if marker is None else {"marker": marker})
            page = client.get("/v1/leases", params=params).json()["leases"]
            found += len(page)
            if len(page) < 1000:
                return found
            marker = page[-1]["id"]


def run_mixed(
    config: MixedConfig,
    *,
    around_load: Callable[[RunningServer], AbstractContextManager[Any]] = lambda _s: nullcontext(),
    keep: bool = False,
) -> dict[str, Any]:
    with (
        climate_server(
            config.db,
            pg_admin_url=config.pg_admin_url,
            keep=keep,
            serve_workers=config.workers,
            server_src=config.server_src,
        ) as server,
        tempfile.TemporaryDirectory(prefix="climate-mixed-") as scratch,
    ):
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            hosts = create_hosts(client, config.hosts, "mx")
        out = Path(scratch) / "records.json"
        command = [
            sys.executable,
            "-m",
            "bench.mixed_client",
            "--base-url",
            server.base_url,
            "--clients",
            str(config.clients),
            "--seconds",
            str(config.seconds),
            "--hosts",
            str(config.hosts),
            "--out",
            str(out),
        ]
        # The routes' counts at the start, after the first EDGE_SECONDS, EDGE_SECONDS before
        # the end and at the end: what a request of each route cost in the first and last.
        edges = [EDGE_SECONDS, config.seconds - EDGE_SECONDS]
        if config.seconds < 2 * EDGE_SECONDS:
            edges = []  # the two windows would overlap
        scrapes = [_route_counts(server)]
        with around_load(server):
            began = time.time()
            samples = [_sample(server, 0.0)]
            proc = subprocess.Popen(command, cwd=ROOT)
            with contextlib.ExitStack() as stack:
                stack.callback(_stop, proc)
                while proc.poll() is None:
                    time.sleep(1.0)
                    samples.append(_sample(server, time.time() - began))
                    if edges and time.time() - began >= edges[0]:
                        edges.pop(0)
                        scrapes.append(_route_counts(server))
            if proc.returncode != 0:
                raise RuntimeError(f"the load client exited with {proc.returncode}")
        scrapes.append(_route_counts(server))
        load = json.loads(out.read_text())
        leases = _lease_count(server)
        peak = rss_mb(server.pid, "VmHWM")
    # Time 0 is when the client's threads began; the samples move onto its clock.
    shift = load["started_epoch"] - began
    samples = [Sample(s.at - shift, s.rss_mb, s.cpu_seconds, s.db_mb) for s in samples]
    result = analyse(config, hosts, load, samples, leases, peak)
    if len(scrapes) == 4:  # a run long enough for both edges
        result["route_cpu"] = {
            "first": _route_costs(scrapes[0], scrapes[1]),
            "last": _route_costs(scrapes[2], scrapes[3]),
        }
    return result


def run_mixed_against(
    config: MixedConfig,
    rev: str,
    *,
    around_load: Callable[[RunningServer], AbstractContextManager[Any]] = lambda _s: nullcontext(),
    keep: bool = False,
) -> dict[str, Any]:
    """The same load on ``rev``'s server (one process: what ``climate serve`` was there), then on
    this checkout's, back to back; the first run's figures go in ``result["baseline"]``."""
    with checkout(rev) as src:
        before = run_mixed(replace(config, workers=1, server_src=src), keep=keep)
    result = run_mixed(config, around_load=around_load, keep=keep)
    result["baseline"] = {
        "rev": rev,
        "workers": 1,
        "requests_per_second": before["requests_per_second"],
        "create_latency_ms": before["create_latency_ms"],
        "server": before["server"],
        "slices": before["slices"],
    }
    return result


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def analyse(
    config: MixedConfig,
    hosts: dict[str, Any],
    load: dict[str, Any],
    samples: list[Sample],
    leases: int,
    peak_rss_mb: float | None,
) -> dict[str, Any]:
    records: list[list[Any]] = load["records"]
    wall = max((r[3] for r in records), default=config.seconds)
    operations: dict[str, Any] = {}
    for name in WEIGHTS:
        mine = [r for r in records if r[0] == name]
        operations[name] = {
            "latency_ms": summary([(r[3] - r[2]) * 1000.0 for r in mine]),
            "statuses": dict(sorted(Counter(str(r[1]) for r in mine).items())),
            "refusals": dict(Counter(r[4] for r in mine if r[1] == 409)),
        }
    creates = [r for r in records if r[0] in CREATES]
    statuses = Counter(r[1] for r in records)
    first, last = samples[0], samples[-1]
    server_cpu = None
    if first.cpu_seconds is not None and last.cpu_seconds is not None:
        server_cpu = last.cpu_seconds - first.cpu_seconds
    return {
        "config": asdict(config) | {"slice_seconds": config.slice_seconds},
        "hosts": hosts,
        "requests": len(records),
        "wall_seconds": wall,
        "requests_per_second": len(records) / wall if wall else 0.0,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": sum(v for k, v in statuses.items() if k >= 500),
        "no_answer": statuses.get(0, 0),
        "transport_errors": sorted({r[4] for r in records if r[1] == 0})[:5],
        "create_latency_ms": summary([(r[3] - r[2]) * 1000.0 for r in creates]),
        "operations": operations,
        "slices": _slices(config, records, samples),
        "server": {
            "rss_mb_start": first.rss_mb,
            "rss_mb_end": last.rss_mb,
            "peak_rss_mb": peak_rss_mb,
            "cpu_seconds": server_cpu,
            "cpu_share_of_one_core": server_cpu / wall if server_cpu is not None and wall else None,
        },
        "client_cpu_seconds": load["cpu_seconds"],
        "database": {"mb_start": first.db_mb, "mb_end": last.db_mb, "leases_end": leases},
    }


def _slices(
    config: MixedConfig, records: list[list[Any]], samples: list[Sample]
) -> list[dict[str, Any]]:
    """Per slice of the run, by completion time: requests/s, creations/s and their median, and
    the server's CPU share, RSS and database size at the slice's end."""
    width = config.slice_seconds
    count = max(1, round(config.seconds / width))
    found = []
    for i in range(count):
        low, high = i * width, (i + 1) * width
        last_slice = i == count - 1  # also takes the requests finishing after the deadline
        done = [r for r in records if low <= r[3] and (r[3] < high or last_slice)]
        made = [(r[3] - r[2]) * 1000.0 for r in done if r[0] in CREATES]
        span = max(high, max((r[3] for r in done), default=high)) - low if last_slice else width
        before = _at(samples, low)
        after = _at(samples, low + span)
        cpu = used = None
        if (
            before.cpu_seconds is not None
            and after.cpu_seconds is not None
            and after.at > before.at
        ):
            used = after.cpu_seconds - before.cpu_seconds
            cpu = used / (after.at - before.at)
        found.append(
            {
                "start": low,
                "seconds": span,
                "requests_per_second": len(done) / span,
                "creates_per_second": len(made) / span,
                "create_p50_ms": percentile(made, 50),
                "server_cpu_share": cpu,
                # What a request costs the server, whatever else shares the machine's CPUs.
                "requests_per_cpu_second": len(done) / used if used else None,
                "rss_mb": after.rss_mb,
                "db_mb": after.db_mb,
            }
        )
    return found


def _at(samples: list[Sample], when: float) -> Sample:
    """The last sample taken at or before ``when`` (the first one if none)."""
    chosen = samples[0]
    for sample in samples:
        if sample.at <= when:
            chosen = sample
    return chosen


def _edges(result: dict[str, Any]) -> tuple[float, float]:
    """Requests/s over the first and over the last ``EDGE_SECONDS`` of the run (whole slices)."""
    slices = result["slices"]
    count = max(1, min(len(slices) // 2, round(EDGE_SECONDS / result["config"]["slice_seconds"])))

    def rate(part: list[dict[str, Any]]) -> float:
        seconds = sum(float(s["seconds"]) for s in part)
        done = sum(float(s["requests_per_second"]) * float(s["seconds"]) for s in part)
        return done / seconds

    return rate(slices[:count]), rate(slices[-count:])


def mixed_targets(result: dict[str, Any]) -> list[Target]:
    clients = result["config"]["clients"]
    create_p99 = result["create_latency_ms"]["p99"]
    first, last = _edges(result)
    baseline = result.get("baseline")
    if baseline is None:
        ratio, against = None, "no baseline in this run (--mixed-against)"
    else:
        ratio = result["requests_per_second"] / baseline["requests_per_second"]
        against = (
            f"{result['requests_per_second']:.1f} against {baseline['rev']}'s "
            f"{baseline['requests_per_second']:.1f} in this run; " + TODAY + "58-74/s"
        )
        if baseline["rev"] != BASELINE_REV:
            against += f" (the goal is {THROUGHPUT_GOAL:g}x {BASELINE_REV}'s)"
    return [
        Target(
            f"5xx answers, mixed load, {clients} clients",
            float(result["server_errors"]),
            0,
            "answers",
            note=TODAY + "0",
        ),
        Target("requests without an answer, mixed load", float(result["no_answer"]), 0, "requests"),
        Target(
            f"requests/s, mixed load, {clients} clients, over "
            f"{BASELINE_REV if baseline is None else baseline['rev']}'s",
            ratio,
            THROUGHPUT_GOAL,
            "x",
            higher_is_better=True,
            note=against,
        ),
        Target(
            f"requests/s, last {EDGE_SECONDS:g} s of the mixed load over the first",
            last / first if first else None,
            KEPT_GOAL,
            "x",
            higher_is_better=True,
            note=f"{first:.1f} -> {last:.1f} /s; {TODAY}requests/s falling as the database grows",
        ),
        Target(
            "lease creation p99, mixed load",
            None if create_p99 != create_p99 else create_p99,
            CREATE_P99_GOAL_MS,
            "ms",
            note=TODAY + "1.9-2.6 s, p50 1.2 s",
        ),
        Target(
            "climate serve RSS at the end, mixed load",
            result["server"]["rss_mb_end"],
            RSS_GOAL_MB,
            "MB",
            note=TODAY + "117 -> 242 MB over three runs",
        ),
    ]


def _against(result: dict[str, Any]) -> str:
    baseline = result.get("baseline")
    if baseline is None:
        return ""
    return (
        f"; {baseline['rev']} (one process) {baseline['requests_per_second']:.1f} in the same "
        f"run, creation p99 {fmt(baseline['create_latency_ms']['p99'])} ms"
    )


def print_mixed(result: dict[str, Any]) -> None:
    c = result["config"]
    server, database = result["server"], result["database"]
    print()
    print(
        f"scenario mixed: {c['clients']} clients (own process, back to back) for "
        f"{c['seconds']:g} s on {c['hosts']} hosts, {c['db']}, climate serve "
        f"--workers {c['workers']} (its figures: every process of it); weights "
        + ", ".join(f"{name} {w}" for name, w in WEIGHTS.items())
    )
    print(
        table(
            ("", "value"),
            [
                ("requests", f"{result['requests']:,} in {result['wall_seconds']:.1f} s"),
                ("requests/s", f"{result['requests_per_second']:.1f}" + _against(result)),
                ("status codes", " ".join(f"{k}: {v}" for k, v in result["statuses"].items())),
                ("5xx / no answer", f"{result['server_errors']} / {result['no_answer']}"),
                (
                    "climate serve RSS",
                    f"{fmt(server['rss_mb_start'])} MB -> {fmt(server['rss_mb_end'])} MB "
                    f"(peak {fmt(server['peak_rss_mb'])} MB)",
                ),
                (
                    "climate serve CPU",
                    f"{fmt(server['cpu_seconds'])} s, "
                    f"{fmt(100 * (server['cpu_share_of_one_core'] or 0.0))}% of one core",
                ),
                ("load client CPU", f"{fmt(result['client_cpu_seconds'])} s"),
                (
                    "database",
                    f"{fmt(database['mb_start'])} MB -> {fmt(database['mb_end'])} MB, "
                    f"{database['leases_end']:,} leases at the end",
                ),
            ],
            align="ll",
        )
    )
    print()
    print("  per operation, client-side latency in ms (loopback HTTP included)")
    rows = []
    for name, op in result["operations"].items():
        lat = op["latency_ms"]
        statuses = " ".join(f"{k}:{v}" for k, v in op["statuses"].items())
        refusals = ", ".join(f"{k or '?'} {v}" for k, v in op["refusals"].items())
        rows.append(
            [
                name,
                lat["count"],
                lat["median"],
                lat["p95"],
                lat["p99"],
                lat["max"],
                statuses,
                refusals,
            ]
        )
    print(
        table(
            ("operation", "n", "p50", "p95", "p99", "max", "statuses", "409 by kind"),
            rows,
            indent="    ",
            align="lrrrrrll",
        )
    )
    print()
    print(
        "  per slice of the run, by completion time (server CPU: its share of one core; per CPU "
        "s: requests per second of server CPU; RSS and database size at the slice's end)"
    )
    slice_rows = [
        [
            f"{s['start']:.0f}-{s['start'] + s['seconds']:.0f} s",
            s["requests_per_second"],
            s["creates_per_second"],
            s["create_p50_ms"],
            "-" if s["server_cpu_share"] is None else f"{100 * s['server_cpu_share']:.0f}%",
            "-" if s["requests_per_cpu_second"] is None else s["requests_per_cpu_second"],
            s["rss_mb"],
            s["db_mb"],
        ]
        for s in result["slices"]
    ]
    print(
        table(
            (
                "slice",
                "requests/s",
                "creates/s",
                "create p50 ms",
                "server CPU",
                "per CPU s",
                "RSS MB",
                "db MB",
            ),
            slice_rows,
            indent="    ",
        )
    )
    _print_route_cpu(result.get("route_cpu"))
    print()
    print(
        table(
            ("target", "measured", "goal", "verdict", "note"),
            [t.row() for t in mixed_targets(result)],
            indent="    ",
            align="lrrll",
        )
    )


def _print_route_cpu(route_cpu: dict[str, Any] | None) -> None:
    if not route_cpu or not (route_cpu["first"] or route_cpu["last"]):
        return
    first, last = route_cpu["first"], route_cpu["last"]
    print()
    print(
        f"  server CPU per request by route, first and last {EDGE_SECONDS:g} s (the worker "
        "thread running the handler: climate_http_route_cpu_seconds_total)"
    )
    rows = []
    for key in sorted(set(first) | set(last), key=lambda k: -last.get(k, {}).get("requests", 0)):
        a, b = first.get(key), last.get(key)
        growth = b["cpu_ms"] / a["cpu_ms"] if a and b and a["cpu_ms"] else None
        rows.append(
            [
                key,
                a["requests"] if a else "-",
                a["cpu_ms"] if a else "-",
                b["requests"] if b else "-",
                b["cpu_ms"] if b else "-",
                "-" if growth is None else f"{growth:.2f}x",
            ]
        )
    print(
        table(
            ("route", "n first", "ms first", "n last", "ms last", "last / first"),
            rows,
            indent="    ",
            align="lrrrrr",
        )
    )
