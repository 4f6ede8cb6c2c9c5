"""Planning quality: two seeded random workloads through Blazar's greedy rule and Climate's planner.

``python -m bench.quality`` (options: ``--help``) replays each workload through three policies and
prints, side by side, acceptance (requests admitted / requests made), utilisation (host-hours
granted / host-hours in the horizon), where the refusals are, and the ceiling:

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

Both workloads (each drawn from one ``random.Random(seed)``; documented in docs/planning.md):

- ``hosts`` hosts (64). Properties: ``gpu=a100`` on every 4th host (25%), ``memory_mb`` 524288 on
  40% of hosts (131072 on the others), ``zone`` z1 for the first half and z2 for the rest.
- Requests arrive one at a time at i.i.d. uniform times over the horizon, handled in arrival
  order; "now" is the arrival time.
- min = max (50%), 1 (30%), ceil(max / 2) (20%). Properties asked: none (60%), ``gpu == a100``
  (15%), ``memory_mb >= 262144`` (15%), ``zone == z1`` (10%). ``max`` is capped at the number of
  hosts matching the properties (nobody asks a 16-GPU testbed for 20 GPU hosts).
- Offered load = sum over requests of max × |window ∩ horizon| / (hosts × horizon): requests are
  drawn until it reaches ``load`` (0.8); the last one is cut short (to the minute) where the load
  is reached, so it is exact.

**interactive** (``INTERACTIVE``, 60 days): a cloud used on demand. Lead time (start - arrival):
30% now, 40% uniform within a day, 30% uniform 1 to 7 days. Duration: 50% 1 to 6 h, 35% 6 to 48 h,
15% 2 to 7 days (to the minute). Max hosts 1 (40%), 2 (20%), 3 to 4 (20%), 5 to 8 (20%).

**advance** (``ADVANCE``, 180 days): advance reservations on a shared testbed, as on Chameleon,
where users book nodes days ahead for an experiment. Lead time: 10% now, 15% within a day, 75%
uniform 1 to 14 days (a testbed that is contended is booked ahead; two weeks is as far as people
plan an experiment). Duration: 40% 2 to 8 h (a working session), 40% 8 h to 2 days, 20% 2 to 7
days (Chameleon's default longest lease is 7 days). Max hosts: 1 (30%), 2 to 4 (30%), and
multi-host experiments, 8 to 16 (25%) and 17 to 32 (15%). The horizon is longer than the
interactive one because its requests are fewer and larger: 60 days give about 300 requests,
whose acceptance moves by several points from seed to seed. These parameters were set before any
result was seen, but for the horizon (first 60 days).

The ceiling of each workload is an upper bound on the requests *any* planner could admit, even
one that knew every request in advance and granted only ``min``: the optimum of a linear
relaxation (``offline_bound``), bounded from above by a dual solution, so the figure is valid
however far the iteration went.
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
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.stats import table
from bench.targets import Target
from climate.db.hosts import LOOKAROUND
from climate.errors import NotEnoughCapacity
from climate.planner.calendar import Calendar as SpanCalendar
from climate.planner.calendar import Span, seconds
from climate.planner.hosts import HostDemand, HostsView, choose_hosts
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
    profile: str
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


Range = tuple[Any, Any]
"""A uniform draw between two bounds (durations to the minute, host counts whole); equal bounds
are that value."""
Weighted = tuple[tuple[float, Any], ...]


@dataclass(frozen=True)
class Profile:
    """How one kind of workload draws its requests (each field: weights and what they pick)."""

    name: str
    horizon_days: float
    lead: Weighted
    """Start - arrival: ranges of durations."""
    duration: Weighted
    """Ranges of durations."""
    size: Weighted
    """Max hosts: ranges of counts."""
    low: Weighted
    """Min hosts: ``"max"``, ``"one"`` or ``"half"`` (ceil(max / 2))."""
    properties: Weighted
    """Property queries, ``""`` for none."""


ZERO = dt.timedelta(0)
INTERACTIVE = Profile(
    name="interactive",
    horizon_days=60.0,
    lead=((0.3, (ZERO, ZERO)), (0.4, (ZERO, DAY)), (0.3, (DAY, 7 * DAY))),
    duration=((0.5, (HOUR, 6 * HOUR)), (0.35, (6 * HOUR, 2 * DAY)), (0.15, (2 * DAY, 7 * DAY))),
    size=((0.4, (1, 1)), (0.2, (2, 2)), (0.2, (3, 4)), (0.2, (5, 8))),
    low=((0.5, "max"), (0.3, "one"), (0.2, "half")),
    properties=((0.6, ""), (0.15, GPU), (0.15, BIG_MEMORY), (0.1, ZONE)),
)
ADVANCE = Profile(
    name="advance",
    horizon_days=180.0,
    lead=((0.1, (ZERO, ZERO)), (0.15, (ZERO, DAY)), (0.75, (DAY, 14 * DAY))),
    duration=((0.4, (2 * HOUR, 8 * HOUR)), (0.4, (8 * HOUR, 2 * DAY)), (0.2, (2 * DAY, 7 * DAY))),
    size=((0.3, (1, 1)), (0.3, (2, 4)), (0.25, (8, 16)), (0.15, (17, 32))),
    low=INTERACTIVE.low,
    properties=INTERACTIVE.properties,
)


def _pick(rng: random.Random, weighted: Weighted) -> Any:
    x = rng.random()
    for weight, value in weighted:
        if x < weight:
            return value
        x -= weight
    return weighted[-1][1]


def _draw(rng: random.Random, bounds: Range) -> Any:
    low, high = bounds
    if low == high:
        return low
    if isinstance(low, int):
        return rng.randint(low, high)
    minute = dt.timedelta(minutes=1)
    return dt.timedelta(minutes=round(rng.uniform(low / minute, high / minute)))


def make_workload(
    seed: int = 42,
    load: float = 0.8,
    hosts: int = 64,
    horizon_days: float | None = None,
    profile: Profile = INTERACTIVE,
) -> Workload:
    """The requests of ``profile`` over ``horizon_days`` (the profile's own by default)."""
    rng = random.Random(seed)
    inventory = host_properties(hosts)
    match = Matcher(inventory)
    matching = {p: len(match(p)) for _, p in profile.properties}
    horizon_end = T0 + dt.timedelta(days=horizon_days or profile.horizon_days)
    capacity = hosts * (horizon_end - T0).total_seconds()
    offered = 0.0
    drawn: list[tuple[dt.datetime, dt.datetime, dt.datetime, int, int, str]] = []
    while offered < load * capacity:
        arrival = T0 + _draw(rng, (ZERO, horizon_end - T0))
        lead = _draw(rng, _pick(rng, profile.lead))
        duration = _draw(rng, _pick(rng, profile.duration))
        high = _draw(rng, _pick(rng, profile.size))
        low = _pick(rng, profile.low)
        properties = _pick(rng, profile.properties)
        # Nobody asks for more hosts than match (the "size" drawn is what the experiment needs).
        high = min(high, matching[properties])
        low = {"max": high, "one": 1, "half": math.ceil(high / 2)}[low]
        start = arrival + lead
        end = start + duration
        left = load * capacity - offered
        if high * _clipped(start, end, T0, horizon_end) > left:
            # The last request ends where the offered load is reached, to the minute.
            end = start + dt.timedelta(minutes=max(1, math.ceil(left / high / 60)))
        drawn.append((arrival, start, end, low, high, properties))
        offered += high * _clipped(start, end, T0, horizon_end)
    drawn.sort(key=lambda r: r[0])
    requests = [Request(i, *r) for i, r in enumerate(drawn)]
    return Workload(profile.name, seed, inventory, requests, (T0, horizon_end), offered / capacity)


def _clipped(start: dt.datetime, end: dt.datetime, lo: dt.datetime, hi: dt.datetime) -> float:
    return max(0.0, (min(end, hi) - max(start, lo)).total_seconds())


# -- calendars in memory ------------------------------------------------------------------------


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

    def view(self, hosts: Iterable[int], start: dt.datetime, end: dt.datetime) -> HostsView:
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


@dataclass(frozen=True)
class Step:
    """One change of the calendar while handling the request that arrived ``at``: reservation
    ``reservation`` gives up ``removed`` and takes ``added`` (an admission removes nothing)."""

    at: dt.datetime
    reservation: int
    removed: frozenset[int]
    added: frozenset[int]


def climate(
    calendar: Calendar,
    request: Request,
    matching: list[int],
    matcher: Matcher,
    stats: RepackStats | None,
    log: list[Step] | None = None,
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
    world = MemoryWorld(calendar, matcher)
    spans = [o for h in matching for o in world.occupants(h, request.start, request.end)]
    codes = {rid: code for code, rid in enumerate({o[2] for o in spans})}
    busy = (
        np.array([s.timestamp() for s, _, _ in spans], dtype=np.float64),
        np.array([e.timestamp() for _, e, _ in spans], dtype=np.float64),
        np.array([codes[rid] for _, _, rid in spans], dtype=np.int64),
    )
    repack = plan(wanted, request.arrival, world, busy=busy)
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
        if log is not None:
            log.append(Step(request.arrival, moved.index, move.removed, move.added))
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

    def counts(
        self, hosts: Collection[int], start: dt.datetime, end: dt.datetime
    ) -> dict[int, int]:
        return {h: len(self.calendar.overlapping(h, start, end)) for h in hosts}

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


POLICIES = ("blazar-greedy", "climate-bestfit", "climate")


def replay(workload: Workload, policy: str, log: list[Step] | None = None) -> dict[str, Any]:
    """Admit the workload's requests one after another with ``policy``; the figures. ``log``, if
    given, receives every admission and every move, in order."""
    matcher = Matcher(workload.hosts)
    longest = max(r.end - r.start for r in workload.requests)
    calendar = Calendar((h["id"] for h in workload.hosts), longest)
    stats = RepackStats() if policy == "climate" else None
    lo, hi = workload.horizon
    refused: list[int] = []
    capacity_refusals = 0
    planning = 0.0
    for request in workload.requests:
        matching = matcher(request.properties)
        began = time.perf_counter()
        if policy == "blazar-greedy":
            chosen = blazar_greedy(calendar, request, matching)
        else:
            chosen = climate(calendar, request, matching, matcher, stats, log)
        planning += time.perf_counter() - began
        if chosen:
            assert request.min <= len(chosen) <= request.max
            assert all(calendar.free(h, request.start, request.end) for h in chosen)
            calendar.add(request, chosen)
            if log is not None:
                log.append(Step(request.arrival, request.index, frozenset(), frozenset(chosen)))
            continue
        refused.append(request.index)
        if _short_at_some_instant(calendar, request, matching):
            capacity_refusals += 1
    _check_no_double_booking(calendar)
    admitted = len(workload.requests) - len(refused)
    granted = sum(
        len(held) * _clipped(request.start, request.end, lo, hi)
        for request, held in calendar.reservations.values()
    )
    asked = [r.max * (r.end - r.start).total_seconds() for r in workload.requests]
    result: dict[str, Any] = {
        "policy": policy,
        "requests": len(workload.requests),
        "admitted": admitted,
        "acceptance": admitted / len(workload.requests),
        "utilisation": granted / (len(workload.hosts) * (hi - lo).total_seconds()),
        "demand_admitted": (sum(asked) - sum(asked[i] for i in refused)) / sum(asked),
        "refused_capacity": capacity_refusals,
        "refused_placement": len(refused) - capacity_refusals,
        "refused": refused,
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


# -- the ceiling ----------------------------------------------------------------------------------


def offline_bound(workload: Workload, admitted: int, iterations: int = 300) -> float:
    """An upper bound on the requests any planner could admit, knowing them all in advance.

    Relaxation: request r is admitted to the extent x_r in [0, 1], and for every set S of hosts
    that is a union of the requests' matching sets, at every instant, the requests matching only
    within S that are running use at most |S| hosts: sum of min_r x_r <= |S| (every admitted
    request holds at least ``min`` distinct hosts of its matching set). Any real admission
    satisfies this, so the relaxation's optimum bounds them all. Weak duality gives the figure:
    for any prices y >= 0 on (S, instant), sum |S| y + sum over r of max(0, 1 - min_r Y_r) (Y_r:
    the prices r pays over its window) is at least that optimum. The prices are improved by a
    projected subgradient descent; every iterate gives a valid bound and the least is returned.
    ``admitted``, what some planner admitted (so at most the optimum), aims the steps.
    """
    requests = workload.requests
    times = sorted({r.start for r in requests} | {r.end for r in requests})
    position = {t: i for i, t in enumerate(times)}
    first = np.array([position[r.start] for r in requests])
    stop = np.array([position[r.end] for r in requests])
    matcher = Matcher(workload.hosts)
    eligible = [frozenset(matcher(r.properties)) for r in requests]
    family = set(eligible)
    while more := {a | b for a in family for b in family} - family:
        family |= more
    sets = sorted(family, key=lambda s: (len(s), sorted(s)))
    size = np.array([len(s) for s in sets], dtype=float)
    within = np.array([[e <= s for e in eligible] for s in sets])
    need = np.array([r.min for r in requests], dtype=float)
    prices = np.zeros((len(sets), len(times) - 1))
    best = float(len(requests))
    for _ in range(iterations):
        paid = np.concatenate((np.zeros((len(sets), 1)), np.cumsum(prices, axis=1)), axis=1)
        slack = 1 - need * (within * (paid[:, stop] - paid[:, first])).sum(axis=0)
        bound = float((size[:, None] * prices).sum() + np.maximum(0, slack).sum())
        best = min(best, bound)
        taken = slack > 0
        gradient = np.empty_like(prices)
        for k in range(len(sets)):
            used = np.zeros(len(times))
            np.add.at(used, first, need * (taken & within[k]))
            np.add.at(used, stop, -need * (taken & within[k]))
            gradient[k] = size[k] - np.cumsum(used)[:-1]
        gradient[(prices <= 0) & (gradient > 0)] = 0
        norm = float((gradient * gradient).sum())
        if norm == 0:
            break
        target = (admitted + best) / 2
        prices = np.maximum(0, prices - (bound - target) / norm * gradient)
    return best


# -- where the refusals are -----------------------------------------------------------------------


SIZE_CLASSES = ((1, "1"), (4, "2-4"), (8, "5-8"), (16, "9-16"), (1 << 30, "17+"))
LEAD_CLASSES = (
    (ZERO, "now"),
    (DAY, "within a day"),
    (7 * DAY, "1-7 days"),
    (dt.timedelta.max, "7-14 days"),
)
PROPERTY_NAMES = {"": "no filter", GPU: "gpu", BIG_MEMORY: "big memory", ZONE: "zone z1"}


def _size_class(r: Request) -> str:
    return next(name for top, name in SIZE_CLASSES if r.max <= top)


def _lead_class(r: Request) -> str:
    return next(name for top, name in LEAD_CLASSES if r.start - r.arrival <= top)


CLASSES: tuple[tuple[str, Callable[[Request], str], tuple[str, ...]], ...] = (
    ("max hosts", _size_class, tuple(name for _, name in SIZE_CLASSES)),
    ("lead time", _lead_class, tuple(name for _, name in LEAD_CLASSES)),
    ("properties", lambda r: PROPERTY_NAMES[r.properties], tuple(PROPERTY_NAMES.values())),
)


def refusals_by_class(workload: Workload, results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each class of request (by size, lead time, properties): how many there are and how
    many each policy refused."""
    rows = []
    for kind, classify, names in CLASSES:
        of = [classify(r) for r in workload.requests]
        for name in names:
            count = of.count(name)
            if count:
                refused = {
                    policy: sum(1 for i in r["refused"] if of[i] == name)
                    for policy, r in results.items()
                }
                rows.append({"by": kind, "class": name, "requests": count, "refused": refused})
    return rows


# -- the benchmark --------------------------------------------------------------------------------

PROFILES = {p.name: p for p in (INTERACTIVE, ADVANCE)}
TARGET_WORKLOAD = ADVANCE.name
"""The workload whose gain is compared with the goal: the one where the baseline leaves room."""


def run_workload(
    profile: Profile,
    seed: int = 42,
    load: float = 0.8,
    hosts: int = 64,
    horizon_days: float | None = None,
) -> dict[str, Any]:
    """Replay one seeded workload through the three policies; figures as a JSON-able dict."""
    workload = make_workload(seed, load, hosts, horizon_days, profile)
    results = {p: replay(workload, p) for p in POLICIES}
    base = results["blazar-greedy"]["admitted"]
    gain = {p: (r["admitted"] / base - 1) * 100 if base else math.nan for p, r in results.items()}
    requests = workload.requests
    ceiling = offline_bound(workload, max(r["admitted"] for r in results.values()))
    return {
        "workload": {
            "profile": profile.name,
            "seed": seed,
            "hosts": hosts,
            "horizon_days": (workload.horizon[1] - workload.horizon[0]) / DAY,
            "load_target": load,
            "offered_load": workload.offered_load,
            "requests": len(requests),
            "filtered_requests": sum(1 for r in requests if r.properties),
            "mean_max_hosts": sum(r.max for r in requests) / len(requests),
            "mean_duration_hours": sum((r.end - r.start) / HOUR for r in requests) / len(requests),
            "started_now": sum(1 for r in requests if r.start == r.arrival),
            "booked_a_day_ahead": sum(1 for r in requests if r.start - r.arrival >= DAY),
        },
        "policies": results,
        "gain_percent": gain,
        "ceiling": {
            "admitted": ceiling,
            "acceptance": ceiling / len(requests),
            "gain_percent": (ceiling / base - 1) * 100 if base else math.nan,
        },
        "refusals": refusals_by_class(workload, results),
    }


def run_quality(
    seed: int = 42, load: float = 0.8, hosts: int = 64, horizon_days: float | None = None
) -> dict[str, Any]:
    """Both workloads (``horizon_days`` overrides each profile's own)."""
    return {
        "workloads": {
            name: run_workload(profile, seed, load, hosts, horizon_days)
            for name, profile in PROFILES.items()
        }
    }


def quality_targets(result: dict[str, Any]) -> list[Target]:
    one = result["workloads"][TARGET_WORKLOAD]
    gain = one["gain_percent"]["climate"]
    w = one["workload"]
    return [
        Target(
            f"planning: admitted vs Blazar greedy ({TARGET_WORKLOAD})",
            None if math.isnan(gain) else gain,
            GAIN_GOAL,
            "%",
            higher_is_better=True,
            note=f"offered load {w['offered_load']:.2f}, {w['requests']} requests, "
            f"seed {w['seed']}; any planner: at most {one['ceiling']['gain_percent']:+.1f}%",
        )
    ]


def print_quality(result: dict[str, Any]) -> None:
    workloads = result["workloads"]
    for name, one in workloads.items():
        w = one["workload"]
        print(
            f"planning quality, {name}: {w['requests']} requests on {w['hosts']} hosts over "
            f"{w['horizon_days']:g} days, offered load {w['offered_load']:.3f}, seed {w['seed']} "
            f"({w['filtered_requests']} with a property filter, mean max "
            f"{w['mean_max_hosts']:.2f} hosts, mean length {w['mean_duration_hours']:.1f} h, "
            f"{w['started_now']} starting now, {w['booked_a_day_ahead']} a day ahead or more)"
        )
    rows: list[list[object]] = []
    for policy in POLICIES:
        row: list[object] = [policy]
        for one in workloads.values():
            r = one["policies"][policy]
            row += [
                f"{r['admitted']:,}",
                f"{r['acceptance'] * 100:.1f}%",
                f"{one['gain_percent'][policy]:+.1f}%",
                f"{r['utilisation'] * 100:.1f}%",
                f"{r['demand_admitted'] * 100:.1f}%",
                f"{r['refused_capacity']}/{r['refused_placement']}",
            ]
        rows.append(row)
    ceiling_row: list[object] = ["ceiling (any planner)"]
    for one in workloads.values():
        c = one["ceiling"]
        ceiling_row += [
            f"{c['admitted']:,.0f}",
            f"{c['acceptance'] * 100:.1f}%",
            f"{c['gain_percent']:+.1f}%",
            "",
            "",
            "",
        ]
    rows.append(ceiling_row)
    headers: list[str] = ["policy"]
    for name in workloads:
        headers += [name, "acceptance", "vs greedy", "utilisation", "demand", "refused cap/pl"]
    print(table(headers, rows))
    print(
        "  admitted; demand: max hosts x hours of the requests admitted / of all requests;"
        " utilisation: host-hours granted / host-hours in the horizon; refused cap(acity): at"
        " some instant of the window fewer than min matching hosts were idle (no choice of hosts"
        " and no move could admit it), pl(acement): the others. Ceiling: an upper bound on what"
        " any planner could admit (linear relaxation, see bench/quality.py)."
    )
    for name, one in workloads.items():
        repack = one["policies"]["climate"].get("repack")
        if repack:
            mean_ms = repack["seconds"] * 1000 / max(1, repack["attempts"])
            print(
                f"  re-optimisation, {name}: {repack['attempts']} refusals searched, "
                f"{repack['admitted']} admitted by moving {repack['reservations_moved']} "
                f"reservations ({repack['hosts_moved']} hosts); {mean_ms:.1f} ms per search on "
                f"average, slowest {repack['slowest_ms']:.1f} ms"
            )
    print()
    for name, one in workloads.items():
        refusal_rows = [
            [
                row["by"],
                row["class"],
                row["requests"],
                *(
                    f"{row['refused'][p]} ({row['refused'][p] / row['requests'] * 100:.0f}%)"
                    for p in POLICIES
                ),
            ]
            for row in one["refusals"]
        ]
        print(f"refused requests by class, {name}")
        print(table(("by", "class", "requests", *POLICIES), refusal_rows))
    for target in quality_targets(result):
        print("  " + "  ".join(str(c) for c in target.row()).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, action="append", help="random seed (repeatable; default 42)")
    p.add_argument("--load", type=float, default=0.8, help="offered load (default %(default)s)")
    p.add_argument("--hosts", type=int, default=64, help="hosts (default %(default)s)")
    p.add_argument(
        "--horizon-days", type=float, help="override each workload's horizon (60 and 180 days)"
    )
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
