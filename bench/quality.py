"""Planning quality: one seeded random workload through Blazar's greedy rule and Climate's planner.

``python -m bench.quality`` (options: ``--help``) prints acceptance (requests admitted / requests
made) and utilisation (host-hours granted / host-hours in the horizon) of:

- **blazar-greedy**: Blazar 18's ``_matching_hosts`` (``blazar/plugins/oshosts/host_plugin.py``)
  as written. Among the matching hosts, those with no allocation row at all (Blazar deletes a
  reservation's rows when its lease ends, so: no allocation ending after now) are "not
  allocated"; the others are kept if free over the whole window. If at least ``min`` hosts are
  not allocated, take the first ``max`` of those; else the first ``max`` of the free allocated
  ones followed by the not allocated ones; refuse if fewer than ``min``. Hosts in database order
  (id); ``cleaning_time`` 0 and ``randomize_host_selection`` off, Blazar's defaults.
- **climate-bestfit**: Climate's ``choose_hosts`` alone (best fit in time), for reference.
- **climate**: what the service does: ``choose_hosts``, and when it refuses, re-optimisation of
  pending leases (``climate.planner.repack.plan``) then ``choose_hosts`` again.

Everything runs in memory (no database, no HTTP); Climate's side calls the same planner functions
as ``resources/hosts.py`` with calendars built the way ``db/hosts.py: calendars()`` builds them.

The workload (all drawn from one ``random.Random(seed)``; documented in docs/planning.md):

- ``hosts`` hosts (64). Properties: ``gpu=a100`` on every 4th host (25%), ``memory_mb`` 524288 on
  40% of hosts (131072 on the others), ``zone`` z1 for the first half and z2 for the rest.
- Requests arrive one at a time at i.i.d. uniform times over the horizon [0, ``horizon_days``)
  (60 days), handled in arrival order; "now" is the arrival time.
- Lead time (start - arrival): 30% start now, 40% uniform within a day, 30% uniform 1 to 7 days.
- Duration: 50% short (1 to 6 h), 35% medium (6 to 48 h), 15% long (2 to 7 days); to the minute.
- Size: max hosts 1 (40%), 2 (20%), 3 to 4 (20%), 5 to 8 (20%); min = max (50%), 1 (30%),
  ceil(max / 2) (20%).
- Properties asked: none (60%), ``gpu == a100`` (15%), ``memory_mb >= 262144`` (15%),
  ``zone == z1`` (10%).
- Offered load = sum over requests of max × |window ∩ horizon| / (hosts × horizon): requests are
  drawn until it reaches ``load`` (0.8), so it is exact to within one request.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import json
import math
import random
import sys
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.stats import table
from bench.targets import Target
from climate.db.hosts import LOOKAROUND
from climate.errors import NotEnoughCapacity
from climate.planner.calendar import Calendar as SpanCalendar
from climate.planner.calendar import Span, seconds
from climate.planner.hosts import HostCalendar, HostDemand, choose_hosts
from climate.planner.query import Query, parse_query
from climate.planner.repack import Holder, Occupant, RepackDemand, plan

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
GAIN_GOAL = 15.0  # % more requests admitted than the greedy baseline

GPU = json.dumps(["==", "$gpu", "a100"])
BIG_MEMORY = json.dumps([">=", "$memory_mb", "262144"])
ZONE = json.dumps(["==", "$zone", "z1"])


@dataclass(frozen=True)
class Request:
    index: int
    arrival: dt.datetime
    start: dt.datetime
    end: dt.datetime
    min: int
    max: int
    properties: str


@dataclass(frozen=True)
class Workload:
    seed: int
    hosts: list[dict[str, Any]]
    requests: list[Request]
    horizon: tuple[dt.datetime, dt.datetime]
    offered_load: float


# -- the workload --------------------------------------------------------------------------------


def host_properties(count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i + 1,
            "hypervisor_hostname": f"compute-{i + 1}",
            "memory_mb": 524288 if i % 5 in (1, 2) else 131072,
            "zone": "z1" if i < count // 2 else "z2",
            **({"gpu": "a100"} if i % 4 == 0 else {}),
        }
        for i in range(count)
    ]


def _pick(rng: random.Random, weighted: Sequence[tuple[float, Any]]) -> Any:
    x = rng.random()
    for weight, value in weighted:
        if x < weight:
            return value
        x -= weight
    return weighted[-1][1]


def _minutes(rng: random.Random, low: dt.timedelta, high: dt.timedelta) -> dt.timedelta:
    return dt.timedelta(
        minutes=round(rng.uniform(low / dt.timedelta(minutes=1), high / dt.timedelta(minutes=1)))
    )


def make_workload(
    seed: int = 42, load: float = 0.8, hosts: int = 64, horizon_days: float = 60.0
) -> Workload:
    rng = random.Random(seed)
    horizon_end = T0 + dt.timedelta(days=horizon_days)
    capacity = hosts * (horizon_end - T0).total_seconds()
    offered = 0.0
    drawn: list[tuple[dt.datetime, dt.datetime, dt.datetime, int, int, str]] = []
    while offered < load * capacity:
        arrival = T0 + _minutes(rng, dt.timedelta(0), horizon_end - T0)
        lead = _pick(
            rng,
            [
                (0.3, lambda: dt.timedelta(0)),
                (0.4, lambda: _minutes(rng, dt.timedelta(0), DAY)),
                (0.3, lambda: _minutes(rng, DAY, 7 * DAY)),
            ],
        )()
        duration = _pick(
            rng,
            [
                (0.5, lambda: _minutes(rng, HOUR, 6 * HOUR)),
                (0.35, lambda: _minutes(rng, 6 * HOUR, 2 * DAY)),
                (0.15, lambda: _minutes(rng, 2 * DAY, 7 * DAY)),
            ],
        )()
        high = _pick(
            rng,
            [
                (0.4, lambda: 1),
                (0.2, lambda: 2),
                (0.2, lambda: rng.randint(3, 4)),
                (0.2, lambda: rng.randint(5, 8)),
            ],
        )()
        low = _pick(rng, [(0.5, high), (0.3, 1), (0.2, math.ceil(high / 2))])
        properties = _pick(rng, [(0.6, ""), (0.15, GPU), (0.15, BIG_MEMORY), (0.1, ZONE)])
        start = arrival + lead
        end = start + duration
        drawn.append((arrival, start, end, low, high, properties))
        offered += high * _clipped(start, end, T0, horizon_end)
    drawn.sort(key=lambda r: r[0])
    requests = [Request(i, *r) for i, r in enumerate(drawn)]
    return Workload(seed, host_properties(hosts), requests, (T0, horizon_end), offered / capacity)


def _clipped(start: dt.datetime, end: dt.datetime, lo: dt.datetime, hi: dt.datetime) -> float:
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


# -- calendars in memory ------------------------------------------------------------------------


@dataclass
class Booking:
    start: dt.datetime
    end: dt.datetime
    reservation: int


class Calendar:
    """Every allocation ever made, per host, sorted by start (what host_allocations holds), and
    the service's in-memory calendar (``climate.planner.calendar``) kept alongside, which gives
    Climate's planner exactly the view admission gives it."""

    def __init__(self, host_ids: Iterable[int], longest: dt.timedelta) -> None:
        self.by_host: dict[int, list[tuple[dt.datetime, dt.datetime, int]]] = {
            h: [] for h in host_ids
        }
        self.reservations: dict[int, tuple[Request, set[int]]] = {}
        self.longest = longest
        self.spans = SpanCalendar()

    def add(self, request: Request, hosts: Iterable[int]) -> None:
        held = self.reservations.setdefault(request.index, (request, set()))[1]
        for h in hosts:
            bisect.insort(self.by_host[h], (request.start, request.end, request.index))
            held.add(h)
            self.spans.add(
                Span(h, seconds(request.start), seconds(request.end), str(request.index))
            )

    def remove(self, request: Request, hosts: Iterable[int]) -> None:
        held = self.reservations[request.index][1]
        for h in hosts:
            self.by_host[h].remove((request.start, request.end, request.index))
            held.discard(h)
        owner = str(request.index)
        for span in self.spans.drop_owner(owner):
            if span.host_id in held:
                self.spans.add(span)

    def overlapping(
        self, host: int, start: dt.datetime, end: dt.datetime
    ) -> list[tuple[dt.datetime, dt.datetime, int]]:
        rows = self.by_host[host]
        stop = bisect.bisect_left(rows, (end,))
        first = bisect.bisect_left(rows, (start - self.longest,))
        return [r for r in rows[first:stop] if r[1] > start]

    def free(self, host: int, start: dt.datetime, end: dt.datetime) -> bool:
        return not self.overlapping(host, start, end)

    def view(
        self, hosts: Iterable[int], start: dt.datetime, end: dt.datetime
    ) -> list[HostCalendar]:
        """What admission's calendar view gives choose_hosts."""
        return self.spans.view(
            ((h, f"compute-{h}") for h in hosts), start, end, (), LOOKAROUND.total_seconds()
        )


# -- the planners ---------------------------------------------------------------------------------


class Matcher:
    def __init__(self, hosts: list[dict[str, Any]]) -> None:
        self.hosts = hosts
        self._cache: dict[str, list[int]] = {}

    def __call__(self, properties: str) -> list[int]:
        found = self._cache.get(properties)
        if found is None:
            query: Query = parse_query("resource_properties", properties)
            found = [h["id"] for h in self.hosts if query.matches(h)]
            self._cache[properties] = found
        return found


def blazar_greedy(calendar: Calendar, request: Request, matching: list[int]) -> list[int]:
    """Blazar 18 ``_matching_hosts``, hosts in id order (its database order)."""
    now = request.arrival
    not_allocated: list[int] = []
    allocated: list[int] = []
    for host in matching:
        rows = calendar.by_host[host]
        recent = rows[bisect.bisect_left(rows, (now - calendar.longest,)) :]
        # Blazar deletes allocation rows at the lease's end: a host whose rows all ended has none.
        if not any(e > now for _, e, _ in recent):
            not_allocated.append(host)
        elif calendar.free(host, request.start, request.end):
            allocated.append(host)
    if len(not_allocated) >= request.min:
        return not_allocated[: request.max]
    every = allocated + not_allocated
    return every[: request.max] if len(every) >= request.min else []


@dataclass
class RepackStats:
    attempts: int = 0
    admitted: int = 0
    reservations_moved: int = 0
    hosts_moved: int = 0
    steps: int = 0
    seconds: float = 0.0
    slowest_ms: float = 0.0


def climate(
    calendar: Calendar,
    request: Request,
    matching: list[int],
    matcher: Matcher,
    stats: RepackStats | None,
) -> list[int]:
    """resources/hosts.py admit(), in memory: choose_hosts, then re-optimisation if refused."""
    demand = HostDemand(start=request.start, end=request.end, min=request.min, max=request.max)
    calendars = calendar.view(matching, request.start, request.end)
    try:
        return choose_hosts(demand, calendars)
    except NotEnoughCapacity:
        if stats is None:
            return []
    stats.attempts += 1
    began = time.perf_counter()
    closed = len(matching) == len(calendar.by_host)
    wanted = RepackDemand(
        request.start, request.end, request.min, frozenset(matching), closed=closed
    )
    busy = {c.host_id: c.busy for c in calendars}
    repack = plan(wanted, request.arrival, MemoryWorld(calendar, matcher), busy=busy)
    spent = time.perf_counter() - began
    stats.seconds += spent
    stats.slowest_ms = max(stats.slowest_ms, spent * 1000)
    if repack is None:
        return []
    stats.steps += repack.steps
    for move in repack.moves:
        moved = calendar.reservations[int(move.reservation_id)][0]
        calendar.remove(moved, move.removed)
        calendar.add(moved, move.added)
        stats.reservations_moved += 1
        stats.hosts_moved += len(move.added)
    chosen = choose_hosts(demand, calendar.view(matching, request.start, request.end))
    stats.admitted += 1
    return chosen


class MemoryWorld:
    """The calendar as the planner's re-optimisation reads it (the service reads its in-memory
    calendar and the reservations' rows the same way). Every reservation here is pending: the
    planner itself leaves alone those that have started."""

    def __init__(self, calendar: Calendar, matcher: Matcher) -> None:
        self.calendar = calendar
        self.matcher = matcher

    def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> list[Occupant]:
        return [(s, e, str(rid)) for s, e, rid in self.calendar.overlapping(host, start, end)]

    def holders(self, ids: Collection[str]) -> dict[str, Holder]:
        found = {}
        for rid in ids:
            request, held = self.calendar.reservations[int(rid)]
            found[rid] = Holder(
                id=rid,
                lease_id=rid,
                start=request.start,
                end=request.end,
                hosts=frozenset(held),
                eligible=frozenset(self.matcher(request.properties)),
                pending=True,
            )
        return found


def replay(workload: Workload, policy: str) -> dict[str, Any]:
    """Admit the workload's requests one after another with ``policy``; the figures."""
    matcher = Matcher(workload.hosts)
    longest = max(r.end - r.start for r in workload.requests)
    calendar = Calendar((h["id"] for h in workload.hosts), longest)
    stats = RepackStats() if policy == "climate" else None
    lo, hi = workload.horizon
    admitted = 0
    granted = 0.0
    asked_admitted = 0.0
    capacity_refusals = 0
    planning = 0.0
    for request in workload.requests:
        matching = matcher(request.properties)
        began = time.perf_counter()
        if policy == "blazar-greedy":
            chosen = blazar_greedy(calendar, request, matching)
        else:
            chosen = climate(calendar, request, matching, matcher, stats)
        planning += time.perf_counter() - began
        if chosen:
            assert request.min <= len(chosen) <= request.max
            assert all(calendar.free(h, request.start, request.end) for h in chosen)
            calendar.add(request, chosen)
            admitted += 1
            asked_admitted += request.max * (request.end - request.start).total_seconds()
        elif _short_at_some_instant(calendar, request, matching):
            capacity_refusals += 1
    for request, held in calendar.reservations.values():
        granted += len(held) * _clipped(request.start, request.end, lo, hi)
    _check_no_double_booking(calendar)
    refused = len(workload.requests) - admitted
    result: dict[str, Any] = {
        "policy": policy,
        "requests": len(workload.requests),
        "admitted": admitted,
        "acceptance": admitted / len(workload.requests),
        "utilisation": granted / (len(workload.hosts) * (hi - lo).total_seconds()),
        "demand_admitted": asked_admitted
        / sum(r.max * (r.end - r.start).total_seconds() for r in workload.requests),
        "refused_capacity": capacity_refusals,
        "refused_placement": refused - capacity_refusals,
        "seconds": planning,
    }
    if stats is not None:
        result["repack"] = asdict(stats)
    return result


def _short_at_some_instant(calendar: Calendar, request: Request, matching: list[int]) -> bool:
    """At some instant of the window, fewer than ``min`` matching hosts are idle: no choice of
    hosts for this request and no move of other leases could have admitted it. The other
    refusals are due to placement (each instant has room, but too few hosts free for the whole
    window)."""
    instants = {request.start}
    busy = {h: calendar.overlapping(h, request.start, request.end) for h in matching}
    for rows in busy.values():
        instants.update(s for s, _, _ in rows if s > request.start)
    return any(
        sum(1 for h in matching if not any(s <= t < e for s, e, _ in busy[h])) < request.min
        for t in instants
    )


def _check_no_double_booking(calendar: Calendar) -> None:
    for rows in calendar.by_host.values():
        for (_, e1, _), (s2, _, _) in zip(rows, rows[1:], strict=False):
            assert e1 <= s2, "a host is booked twice at once"


# -- the benchmark --------------------------------------------------------------------------------


def run_quality(
    seed: int = 42, load: float = 0.8, hosts: int = 64, horizon_days: float = 60.0
) -> dict[str, Any]:
    """Replay one seeded workload through the three policies; figures as a JSON-able dict."""
    workload = make_workload(seed=seed, load=load, hosts=hosts, horizon_days=horizon_days)
    results = {p: replay(workload, p) for p in ("blazar-greedy", "climate-bestfit", "climate")}
    base = results["blazar-greedy"]["admitted"]
    gain = {p: (r["admitted"] / base - 1) * 100 if base else math.nan for p, r in results.items()}
    requests = workload.requests
    return {
        "workload": {
            "seed": seed,
            "hosts": hosts,
            "horizon_days": horizon_days,
            "load_target": load,
            "offered_load": workload.offered_load,
            "requests": len(requests),
            "filtered_requests": sum(1 for r in requests if r.properties),
            "mean_max_hosts": sum(r.max for r in requests) / len(requests),
            "mean_duration_hours": sum((r.end - r.start) / HOUR for r in requests) / len(requests),
            "started_now": sum(1 for r in requests if r.start == r.arrival),
        },
        "policies": results,
        "gain_percent": gain,
    }


def quality_targets(result: dict[str, Any]) -> list[Target]:
    gain = result["gain_percent"]["climate"]
    w = result["workload"]
    return [
        Target(
            "planning: admitted vs Blazar greedy",
            None if math.isnan(gain) else gain,
            GAIN_GOAL,
            "%",
            higher_is_better=True,
            note=f"offered load {w['offered_load']:.2f}, {w['requests']} requests, "
            f"seed {w['seed']}",
        )
    ]


def print_quality(result: dict[str, Any]) -> None:
    w = result["workload"]
    print(
        f"planning quality: {w['requests']} requests on {w['hosts']} hosts over "
        f"{w['horizon_days']:g} days, offered load {w['offered_load']:.3f}, seed {w['seed']} "
        f"({w['filtered_requests']} with a property filter, mean max {w['mean_max_hosts']:.2f} "
        f"hosts, mean length {w['mean_duration_hours']:.1f} h, {w['started_now']} starting now)"
    )
    rows = []
    for policy, r in result["policies"].items():
        rows.append(
            [
                policy,
                r["admitted"],
                f"{r['acceptance'] * 100:.1f}%",
                f"{result['gain_percent'][policy]:+.1f}%",
                f"{r['utilisation'] * 100:.1f}%",
                f"{r['demand_admitted'] * 100:.1f}%",
                r["refused_capacity"],
                r["refused_placement"],
                f"{r['seconds']:.2f}",
            ]
        )
    headers = (
        "policy",
        "admitted",
        "acceptance",
        "vs greedy",
        "utilisation",
        "demand admitted",
        "refused: capacity",
        "placement",
        "seconds",
    )
    print(table(headers, rows))
    best = result["policies"]["blazar-greedy"]["acceptance"]
    print(
        f"  demand admitted: max hosts x hours of the requests admitted / of all requests."
        f" Utilisation: host-hours granted / host-hours in the horizon. Refused for capacity:"
        f" at some instant of the window fewer than min matching hosts were idle (no choice of"
        f" hosts and no move could admit it); placement: the others. Ceiling: with the baseline at "
        f"{best * 100:.1f}%, no planner can admit more than {(1 / best - 1) * 100:+.1f}% more."
    )
    repack = result["policies"]["climate"].get("repack")
    if repack:
        mean_ms = repack["seconds"] * 1000 / max(1, repack["attempts"])
        print(
            f"  re-optimisation: {repack['attempts']} refusals searched, {repack['admitted']} "
            f"admitted by moving {repack['reservations_moved']} reservations "
            f"({repack['hosts_moved']} hosts); {mean_ms:.1f} ms "
            f"per search on average, slowest {repack['slowest_ms']:.1f} ms"
        )
    for target in quality_targets(result):
        print("  " + "  ".join(str(c) for c in target.row()).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, action="append", help="random seed (repeatable; default 42)")
    p.add_argument("--load", type=float, default=0.8, help="offered load (default %(default)s)")
    p.add_argument("--hosts", type=int, default=64, help="hosts (default %(default)s)")
    p.add_argument("--horizon-days", type=float, default=60.0, help="default %(default)s")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    results = []
    for seed in args.seed or [42]:
        result = run_quality(seed, args.load, args.hosts, args.horizon_days)
        print_quality(result)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(t.verdict == "PASS" for r in results for t in quality_targets(r)) else 1


if __name__ == "__main__":
    sys.exit(main())
