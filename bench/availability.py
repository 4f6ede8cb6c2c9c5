"""Availability search latency, planner only (issue 6).

An in-memory calendar is seeded directly (no database, as ``bench.growth`` does) with 20,000
allocations over 2,000 hosts and a year: per host 10 allocations back to back with gaps, each 5
to 30 days long, gaps 1 to 15 days, so that most of the year is booked. Every fourth host has
``gpu=a100`` (500 hosts). Each sample searches the 3 earliest windows of 1 to 7 days with 8 of
those hosts, from a random instant of the first half of the year to the end of the year, on a
one-minute grid: what ``POST /v1/availability`` does after reading the inventory (the free-host
count at every candidate start, then the concrete best-fit choice for the windows found).

A mixed case gives every host a size and adds 1,000 instance reservations (one to three hosts
each, in the gaps between whole-host allocations) and 250 floating IPs with 2,500 allocations,
then searches 4 instances and 1 floating IP: the split of the hosts' calendar into whole-host
spans and instance usage, the instance and address placers, the search.

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
HOST_SIZE = (32, 131_072, 1_000)
INSTANCE_LEASES = 1_000
ADDRESSES = 250
ADDRESS_ALLOCATIONS = 2_500
WANTED_INSTANCES = 4
WANTED_SIZE = (4, 8_192, 40)
MIXED_REQUEST = f"{WANTED_INSTANCES} instances of {WANTED_SIZE[0]} vCPUs + 1 floating IP"


def seed(hosts: int = HOSTS, allocations: int = ALLOCATIONS, seed_value: int = 6) -> Any:
    """A calendar of ``allocations`` spans over ``hosts`` hosts within a year from ``T0``."""
    from climate.planner.calendar import Calendar, Span

    host_ids, starts, ends = booked(hosts, allocations, seed_value)
    return Calendar.of(
        Span(h, s, e, f"a{i}")
        for i, (h, s, e) in enumerate(
            zip(host_ids.tolist(), starts.tolist(), ends.tolist(), strict=True)
        )
    )


def booked(hosts: int, allocations: int, seed_value: int) -> tuple[Any, Any, Any]:
    """Per host, ``allocations // hosts`` spans back to back with gaps (host ids, starts, ends,
    by host then start)."""
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
    return host_ids, starts.ravel(), ends.ravel()


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
        "mixed": run_mixed(samples),
    }


def seed_mixed() -> dict[str, Any]:
    """The same hosts and whole-host allocations, each host sized ``HOST_SIZE``, with
    ``INSTANCE_LEASES`` instance reservations in the gaps between them (one to three hosts
    each), and ``ADDRESSES`` floating IPs with ``ADDRESS_ALLOCATIONS`` allocations."""
    from climate.planner.calendar import Calendar, HostSet, Span
    from climate.planner.instances import Size

    host_ids, starts, ends = booked(HOSTS, ALLOCATIONS, 6)
    per_host = ALLOCATIONS // HOSTS
    gap_start = ends.reshape(HOSTS, per_host)[:, :-1]
    gap_end = starts.reshape(HOSTS, per_host)[:, 1:]
    rng = np.random.default_rng(7)
    uses: list[tuple[int, float, float, Size]] = []
    for _ in range(INSTANCE_LEASES):
        for host in rng.choice(HOSTS, size=int(rng.integers(1, 4)), replace=False).tolist():
            gap = int(rng.integers(0, per_host - 1))
            low, high = float(gap_start[host, gap]), float(gap_end[host, gap])
            begin = low + (high - low) * float(rng.uniform(0, 0.5))
            end = begin + (high - begin) * float(rng.uniform(0.2, 1.0))
            count = int(rng.integers(1, 4))
            uses.append((host + 1, begin, end, Size(2 * count, 4096 * count, 20 * count)))
    spans = [
        Span(h, s, e, f"a{i}")
        for i, (h, s, e) in enumerate(
            zip(host_ids.tolist(), starts.tolist(), ends.tolist(), strict=True)
        )
    ]
    # Each host's instance usage, merged, as the whole-host calendar holds it.
    by_host: dict[int, list[list[float]]] = {}
    for h, s, e, _ in sorted(uses, key=lambda u: (u[0], u[1])):
        merged = by_host.setdefault(h, [])
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    spans += [Span(h, s, e, f"instances:{h}") for h, runs in by_host.items() for s, e in runs]
    fip_ids, fip_starts, fip_ends = booked(ADDRESSES, ADDRESS_ALLOCATIONS, 8)
    addresses = Calendar.of(
        Span(1_000_000 + h, s, e, f"f{i}")
        for i, (h, s, e) in enumerate(
            zip(fip_ids.tolist(), fip_starts.tolist(), fip_ends.tolist(), strict=True)
        )
    )
    table = np.array([(h, s, e, *u.as_tuple()) for h, s, e, u in uses], dtype=np.float64).reshape(
        -1, 6
    )
    return {
        "calendar": Calendar.of(spans),
        "hosts": HostSet((h, f"node-{h}") for h in range(1, HOSTS + 1)),
        "uses": table,
        "addresses": addresses,
        "pool": HostSet(
            (1_000_000 + h, f"10.0.{h // 250}.{h % 250}") for h in range(1, ADDRESSES + 1)
        ),
    }


def search_mixed(world: dict[str, Any], search: Any) -> list[Any]:
    """What ``POST /v1/availability`` does for ``MIXED_REQUEST`` after reading the inventory
    and the instance allocations of the range: split whole-host spans from instance usage,
    build the placers, search."""
    from climate.planner.availability import HostPlacer, HostRequest, earliest
    from climate.planner.instance_search import (
        ComputePlacer,
        InstanceHost,
        InstanceRequest,
        InstanceSpace,
        whole_spans,
    )
    from climate.planner.instances import Size

    look = 86400.0
    hosts, table = world["hosts"], world["uses"]
    low, high = search.start - look, search.end + look
    near = table[(table[:, 1] < high) & (table[:, 2] > low)]
    position, starts, ends = world["calendar"].spans_of(hosts, low, high)
    whole = whole_spans(
        position, starts, ends, near[:, 0].astype(np.int64) - 1, near[:, 1], near[:, 2]
    )
    ids = hosts.ids.tolist()
    size = Size(*HOST_SIZE)
    space = InstanceSpace(
        [InstanceHost(h, n, size) for h, n in zip(ids, hosts.names, strict=True)],
        (position[whole], starts[whole], ends[whole]),
        (near[:, 0].astype(np.int64) - 1, near[:, 1], near[:, 2], near[:, 3:].astype(np.int64)),
        look,
    )
    wanted = InstanceRequest(0, frozenset(ids), Size(*WANTED_SIZE), WANTED_INSTANCES, None)
    compute = ComputePlacer(world["calendar"], [], space, [wanted], search)
    address = HostPlacer(
        world["addresses"], [HostRequest(1, world["pool"], 1, 1, reducible=False)], search
    )
    return earliest([compute, address], search, 3)


def run_mixed(samples: int = SAMPLES) -> dict[str, Any]:
    from climate.planner.availability import SearchRange

    began = time.perf_counter()
    world = seed_mixed()
    seed_seconds = time.perf_counter() - began
    rng = random.Random(13)
    first = int(T0.timestamp())
    timings: list[float] = []
    found = 0
    for _ in range(samples):
        start = first + rng.randrange(0, YEAR // 2)
        search = SearchRange(start, first + YEAR, rng.randrange(1, 8) * 86400, 60)
        clock = time.perf_counter()
        windows = search_mixed(world, search)
        timings.append((time.perf_counter() - clock) * 1000)
        found += bool(windows)
    return {"seed_seconds": seed_seconds, "search_ms": timings, "found": found, "samples": samples}


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
    mixed = result["mixed"]
    ms = mixed["search_ms"]
    print()
    print(
        f"availability, mixed: {mixed['samples']} searches for the 3 earliest windows of 1 to 7 "
        f"days with {MIXED_REQUEST}, the same hosts sized {HOST_SIZE[0]} vCPUs with "
        f"{INSTANCE_LEASES:,} instance reservations beside the whole-host allocations, "
        f"{ADDRESSES} floating IPs with {ADDRESS_ALLOCATIONS:,} allocations (seeded in "
        f"{mixed['seed_seconds']:.1f} s), planner only"
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
                )
            ],
            indent="    ",
        )
    )
    print(f"    searches with a window: {mixed['found']} of {mixed['samples']}")


def availability_targets(result: dict[str, Any]) -> list[Target]:
    return [
        Target(
            "availability search p50, 2,000 hosts / 20,000 allocations",
            percentile(result["search_ms"], 50),
            TARGET_MS,
            "ms",
            note=f"earliest {WANTED}-host gpu window, planner only",
        ),
        Target(
            "availability search p50, mixed, + 1,000 instance reservations",
            percentile(result["mixed"]["search_ms"], 50),
            TARGET_MS,
            "ms",
            note=f"{MIXED_REQUEST}, planner only",
        ),
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
