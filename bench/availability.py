"""Availability search latency, planner only (issue 6).

An in-memory calendar is seeded directly (no database, as ``bench.growth`` does) with 20,000
allocations over 2,000 hosts and a year: per host 10 allocations back to back with gaps, each 5
to 30 days long, gaps 1 to 15 days, so that most of the year is booked. Every fourth host has
``gpu=a100`` (500 hosts). Each sample searches the 3 earliest windows of 1 to 7 days with 8 of
those hosts, from a random instant of the first half of the year to the end of the year, on a
one-minute grid: what ``POST /v1/availability`` does after reading the inventory (the free-host
count at every candidate start, then the concrete best-fit choice for the windows found).

``python -m bench.availability`` prints the figures; ``python -m bench --scenario availability``
too, with the target.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.stats import percentile, table
from bench.targets import Target

T0 = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
YEAR = 365 * 86400
HOSTS = 2_000
ALLOCATIONS = 20_000
GPU_SHARE = 4
WANTED = 8
SAMPLES = 200
TARGET_MS = 50.0


def seed(hosts: int = HOSTS, allocations: int = ALLOCATIONS, seed_value: int = 6) -> Any:
    """A calendar of ``allocations`` spans over ``hosts`` hosts within a year from ``T0``."""
    from climate.planner.calendar import Calendar, Span

    rng = np.random.default_rng(seed_value)
    per_host = allocations // hosts
    day = 86400.0
    lengths = rng.uniform(5, 30, (hosts, per_host)) * day
    gaps = rng.uniform(1, 15, (hosts, per_host)) * day
    ends = T0.timestamp() + np.cumsum(lengths + gaps, axis=1) - gaps
    # Squeezed into the year, so that "over a year" holds whatever the draw.
    scale = np.minimum(1.0, YEAR / (ends[:, -1:] - T0.timestamp()))
    ends = T0.timestamp() + (ends - T0.timestamp()) * scale
    starts = ends - lengths * scale
    host_ids = np.repeat(np.arange(1, hosts + 1), per_host)
    return Calendar.of(
        Span(h, s, e, f"a{i}")
        for i, (h, s, e) in enumerate(
            zip(host_ids.tolist(), starts.ravel().tolist(), ends.ravel().tolist(), strict=True)
        )
    )


def run_availability(samples: int = SAMPLES) -> dict[str, Any]:
    from climate.planner.availability import HostPlacer, HostRequest, SearchRange, earliest
    from climate.planner.calendar import HostSet

    began = time.perf_counter()
    calendar = seed()
    seed_seconds = time.perf_counter() - began
    gpu = HostSet((h, f"node-{h}") for h in range(GPU_SHARE, HOSTS + 1, GPU_SHARE))
    rng = random.Random(12)
    first = int(T0.timestamp())
    timings: list[float] = []
    waits: list[float] = []
    found = 0
    for _ in range(samples):
        start = first + rng.randrange(0, YEAR // 2)
        search = SearchRange(start, first + YEAR, rng.randrange(1, 8) * 86400, 60)
        clock = time.perf_counter()
        placer = HostPlacer(calendar, [HostRequest(0, gpu, WANTED, WANTED)], search)
        windows = earliest([placer], search, 3)
        timings.append((time.perf_counter() - clock) * 1000)
        if windows:
            found += 1
            waits.append((windows[0].start - start) / 3600)
    return {
        "hosts": HOSTS,
        "allocations": ALLOCATIONS,
        "gpu_hosts": len(gpu.ids),
        "samples": samples,
        "seed_seconds": seed_seconds,
        "search_ms": timings,
        "found": found,
        "wait_hours": waits,
    }


def print_availability(result: dict[str, Any]) -> None:
    ms = result["search_ms"]
    waits = result["wait_hours"] or [float("nan")]
    print()
    print(
        f"availability: {result['samples']} searches for the 3 earliest windows of 1 to 7 days "
        f"with {WANTED} of the {result['gpu_hosts']} gpu hosts, {result['hosts']:,} hosts and "
        f"{result['allocations']:,} allocations over a year (seeded in memory in "
        f"{result['seed_seconds']:.1f} s), planner only"
    )
    print(
        table(
            ("", "p50", "p95", "max"),
            [
                (
                    "search, ms",
                    f"{percentile(ms, 50):.2f}",
                    f"{percentile(ms, 95):.2f}",
                    f"{max(ms):.2f}",
                ),
                (
                    "wait to the first window, h",
                    f"{percentile(waits, 50):.1f}",
                    f"{percentile(waits, 95):.1f}",
                    f"{max(waits):.1f}",
                ),
            ],
            indent="    ",
        )
    )
    print(f"    searches with a window: {result['found']} of {result['samples']}")


def availability_targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "availability search p50, 2,000 hosts / 20,000 allocations",
            percentile(result["search_ms"], 50),
            TARGET_MS,
            "ms",
            note=f"earliest {WANTED}-host gpu window, planner only",
        )
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.availability", description=__doc__)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    args = parser.parse_args(argv)
    result = run_availability(args.samples)
    print_availability(result)
    for target in availability_targets(result):
        print("    " + "  ".join(str(cell) for cell in target.row()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
