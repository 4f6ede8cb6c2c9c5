"""How planner-only admission grows with hosts H and allocations A (issue 3).

For each (H, A) of a grid, an in-memory calendar is filled directly with A allocations spread
over H hosts (the distribution of ``bench.scale.seed``: per host, back to back with gaps, each 2 to
48 h long, gaps 1 to 48 h, the first starting in the first day after ``T0``), without any
database: seeding a million allocations through SQL would take most of the benchmark's budget,
and the planner never reads SQL anyway. Then, as ``bench.scale.planner_only`` does, it times one
admission decision (the calendar view of every matching host plus the host choice) for random
windows of 1 to 24 h over the seeded horizon: one host among all hosts, and 8 hosts among the
quarter with ``gpu=a100``. It also counts the allocations overlapping each requested window,
which is what an admission has to look at, whatever the number of allocations stored.

The rows with at most 1,000 hosts and 100,000 allocations are also measured end to end (unless
``--no-http``): seeded through SQL into a fresh ``climate serve`` by ``bench.scale.run_scale``,
single-host lease creation over HTTP.

``python -m bench.growth`` prints the table; ``python -m bench --scenario growth`` too.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.scale import GPU_SHARE, T0, run_scale
from bench.stats import percentile, table

if TYPE_CHECKING:
    from climate.planner.calendar import Calendar

HOSTS = (100, 1_000, 10_000)
ALLOCATIONS = (1_000, 100_000, 1_000_000)
SAMPLES = 200
HTTP_UP_TO = (1_000, 100_000)
"""Rows with at most this many hosts and allocations are also timed over HTTP."""


@dataclass(frozen=True)
class Seeded:
    calendar: Calendar
    starts: np.ndarray
    ends: np.ndarray
    horizon: float
    """End of the seeded allocations, seconds since the epoch."""


def seed_calendar(hosts: int, allocations: int, seed_value: int = 7) -> Seeded:
    """A calendar of ``allocations`` spans over ``hosts`` hosts."""
    from climate.planner.calendar import Calendar, Span, seconds

    rng = np.random.default_rng(seed_value)
    per_host = allocations // hosts
    hour = 3600.0
    lengths = rng.uniform(2, 48, (hosts, per_host)) * hour
    gaps = rng.uniform(1, 48, (hosts, per_host)) * hour
    first = seconds(T0) + rng.uniform(0, 24, (hosts, 1)) * hour
    cursor = first + np.cumsum(lengths + gaps, axis=1)
    ends = cursor - gaps
    starts = ends - lengths
    host_ids = np.repeat(np.arange(1, hosts + 1), per_host)
    calendar = Calendar.of(
        Span(h, s, e, f"a{i}")
        for i, (h, s, e) in enumerate(
            zip(host_ids.tolist(), starts.ravel().tolist(), ends.ravel().tolist(), strict=True)
        )
    )
    horizon = float(cursor[:, -1].max()) if per_host else seconds(T0) + 24 * hour
    return Seeded(calendar, starts.ravel(), ends.ravel(), horizon)


def planner_row(hosts: int, allocations: int, samples: int = SAMPLES) -> dict[str, Any]:
    from climate.errors import NotEnoughCapacity
    from climate.planner.calendar import HostSet, moment
    from climate.planner.hosts import HostDemand, choose_hosts

    began = time.perf_counter()
    seeded = seed_calendar(hosts, allocations)
    seed_seconds = time.perf_counter() - began
    every = HostSet((h, f"node-{h}") for h in range(1, hosts + 1))
    gpu = HostSet((h, f"node-{h}") for h in range(GPU_SHARE, hosts + 1, GPU_SHARE))
    rng = random.Random(11)
    t0 = T0.timestamp()
    timings: dict[str, list[float]] = {"single": [], "eight": []}
    overlapping = []
    for _ in range(samples):
        s = rng.uniform(t0, seeded.horizon)
        e = s + rng.uniform(1, 24) * 3600
        start, end = moment(s), moment(e)
        overlapping.append(int(np.count_nonzero((seeded.starts < e) & (seeded.ends > s))))
        for label, candidates, count in (("single", every, 1), ("eight", gpu, 8)):
            clock = time.perf_counter()
            view = seeded.calendar.view(candidates, start, end)
            try:
                choose_hosts(HostDemand(start, end, count, count), view)
            except NotEnoughCapacity:
                pass
            timings[label].append((time.perf_counter() - clock) * 1000)
    return {
        "hosts": hosts,
        "allocations": allocations,
        "seed_seconds": seed_seconds,
        "single_ms": timings["single"],
        "eight_ms": timings["eight"],
        "overlapping_mean": sum(overlapping) / len(overlapping),
    }


def run_growth(
    hosts: Sequence[int] = HOSTS,
    allocations: Sequence[int] = ALLOCATIONS,
    http: bool = True,
    samples: int = SAMPLES,
) -> dict[str, Any]:
    rows = []
    for h in hosts:
        for a in allocations:
            if a < h:
                continue  # fewer allocations than hosts: most hosts idle, nothing to learn
            row = planner_row(h, a, samples)
            if http and h <= HTTP_UP_TO[0] and a <= HTTP_UP_TO[1]:
                measured = run_scale(h, a, requests=100)
                row["http_single_ms"] = measured["single_ms"]
            rows.append(row)
    return {"samples": samples, "rows": rows}


def print_growth(result: dict[str, Any]) -> None:
    print()
    print(
        "growth: planner-only admission decision (calendar view of every matching host + host "
        f"choice) on an in-memory calendar seeded directly (no SQL), {result['samples']} random "
        "windows of 1 to 24 h per row; HTTP: single-host lease creation on `climate serve` "
        "seeded through SQL (SQLite), 100 requests"
    )
    rows = []
    for r in result["rows"]:
        http = r.get("http_single_ms")
        rows.append(
            [
                f"{r['hosts']:,}",
                f"{r['allocations']:,}",
                *(
                    f"{percentile(r[key], q):.3f}"
                    for key in ("single_ms", "eight_ms")
                    for q in (50, 99)
                ),
                f"{r['overlapping_mean']:,.0f}",
                "-" if http is None else f"{percentile(http, 50):.2f}",
            ]
        )
    headers = [
        "H",
        "A",
        "1-host p50 ms",
        "p99 ms",
        "8-host gpu p50 ms",
        "p99 ms",
        "allocations overlapping the window",
        "HTTP 1-host p50 ms",
    ]
    print(table(headers, rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__)
    parser.add_argument("--hosts", type=int, nargs="+", default=list(HOSTS))
    parser.add_argument("--allocations", type=int, nargs="+", default=list(ALLOCATIONS))
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument(
        "--no-http",
        action="store_true",
        help="skip the HTTP column (H <= 1,000 and A <= 100,000 seeded through SQL; about 80 s)",
    )
    args = parser.parse_args(argv)
    print_growth(run_growth(args.hosts, args.allocations, not args.no_http, args.samples))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
