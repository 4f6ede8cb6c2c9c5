"""Availability: the earliest windows where a request would be admitted, and capacity over time.

Pure: everything is read from a ``Calendar``. A window of ``duration`` starting at ``t`` fits a
host reservation when at least ``min`` of its matching hosts are free over [t, t + duration).
A host is free for such a window exactly when ``t`` lies in one of its *free-start intervals*
[end of a span, start of the next span - duration] (open at the ends of its calendar), so the
number of free hosts at ``t`` is the number of those intervals containing ``t``: two sorted
arrays and two binary searches, for any number of ``t`` at once. That count only grows when a
span ends, so the only starts worth trying are the range's first instant and every end of a busy
span inside the range, each rounded up to the grid: the search is exact, not sampled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from climate.errors import NotEnoughCapacity
from climate.planner.calendar import Calendar, FloatArray, HostSet, IntArray, moment
from climate.planner.hosts import HostDemand, choose_hosts

BoolArray = npt.NDArray[np.bool_]
MICROSECONDS = 1_000_000
MAX_ATTEMPTS = 1000
"""Candidate starts that pass the quick count but are then refused when placed concretely (only
possible when several reservations compete for the same hosts): the search stops after this
many such refusals."""


@dataclass(frozen=True)
class SearchRange:
    """Windows [t, t + duration) with ``start`` <= t and t + duration <= ``end``, ``t`` a
    multiple of ``step``; all in whole seconds since the epoch."""

    start: int
    end: int
    duration: int
    step: int

    @property
    def first(self) -> int:
        return -(-self.start // self.step) * self.step

    @property
    def last(self) -> int:
        """The latest start allowed."""
        return self.end - self.duration

    def on_grid(self, times: FloatArray) -> FloatArray:
        """Each time rounded up to the grid, kept if it is a start the range allows."""
        rounded = np.ceil(times / self.step) * self.step
        return rounded[(rounded >= self.first) & (rounded <= self.last)]


@dataclass(frozen=True)
class Placement:
    """What one reservation of the request would get in a window."""

    index: int
    """Its position in the request."""
    resources: tuple[int, ...]
    names: tuple[str, ...]
    """The names of ``resources``."""
    available: int
    """How many of its resources are free for the whole window (after the reservations before
    it in the request took theirs); for instances, how many instances of its size fit; for
    volumes, the most GB free in one matching pool."""
    quantities: tuple[int, ...] = ()
    """Per resource, how much of it: instances on each host, GB from the pool (empty for
    resources taken whole)."""


@dataclass(frozen=True)
class Window:
    start: int
    end: int
    placements: tuple[Placement, ...]
    """One per reservation of the request, in request order."""


class Placer(Protocol):
    """The search for the reservations of one resource type, in one search range."""

    def candidates(self) -> FloatArray:
        """Starts on the grid at which this type's free capacity may grow."""

    def possible(self, starts: FloatArray) -> BoolArray:
        """Per start, whether the reservations might fit there: exact for a single
        reservation, a necessary condition for several."""

    def place(self, start: int) -> list[Placement] | None:
        """What the reservations would get at ``start``, as admission would choose it; None
        if they do not all fit."""

    def place_window(self, begin: float, end: float) -> list[Placement] | None:
        """As ``place``, for the window [begin, end) (seconds, any length)."""

    def explain(self, begin: float, end: float) -> list[Shortfall]:
        """How each reservation stands in [begin, end), taking what admission would give it
        (at most what is free, even below its min)."""

    def cutoffs(self, begin: float, end: float) -> FloatArray:
        """The times in (begin, end) at which a window from ``begin`` stops fitting on some
        resource: the starts of busy spans."""

    def possible_ends(self, begin: float, ends: FloatArray) -> BoolArray:
        """Per end, whether the reservations might fit over [begin, end): exact for a single
        reservation, a necessary condition for several."""


@dataclass(frozen=True)
class Shortfall:
    """How one reservation of a request stands in a window."""

    index: int
    min: int
    max: int
    matching: int
    """Resources matching its properties."""
    free: int
    """Of those, free for the whole window."""
    available: int
    """Of those, left after the reservations before it in the request took theirs."""
    released: tuple[float, ...]
    """When each busy one is free again (the end of its last span in the window), earliest
    first."""
    reducible: bool = True
    """Whether it may be offered less than its min: whole hosts and devices (min..max) and
    instances (``amount``) may; items reserved by ``amount`` and volumes may not."""

    @property
    def fits(self) -> bool:
        return self.available >= self.min

    @property
    def rule(self) -> str:
        """What refuses it: ``too_few_match`` (fewer resources match than its min),
        ``too_few_free`` (not enough are free for the whole window), ``shared`` (enough are
        free, but reservations before it in the request take them), or ``fits``."""
        if self.fits:
            return "fits"
        if self.matching < self.min:
            return "too_few_match"
        return "too_few_free" if self.free < self.min else "shared"

    @property
    def enough_free_by(self) -> float | None:
        """When ``min`` would be free if nothing else were booked, for ``too_few_free``."""
        needed = self.min - self.free
        if self.rule != "too_few_free" or needed > len(self.released):
            return None
        return self.released[needed - 1]


def longest(placers: Sequence[Placer], begin: float, end: float, shortest: float) -> float | None:
    """The latest end in [begin + shortest, end) such that every placer's reservations fit over
    [begin, that end), or None. Whether they fit changes only where a busy span starts, so
    those are the only ends tried, latest first."""
    ends = np.unique(np.concatenate([p.cutoffs(begin, end) for p in placers]))[::-1]
    ends = ends[ends >= begin + shortest]
    possible = np.ones(len(ends), dtype=np.bool_)
    for placer in placers:
        possible &= placer.possible_ends(begin, ends)
    for attempt, until in enumerate(ends[possible].tolist()):
        if attempt == MAX_ATTEMPTS:
            break
        if all(p.place_window(begin, until) is not None for p in placers):
            return float(until)
    return None


@dataclass(frozen=True)
class CounterOffer:
    """A window and counts that would be admitted instead of a refused request."""

    kind: str
    """``later_start``: the same length and counts, at the earliest start of the search;
    ``fewer_hosts``: the same window, each reservation cut to what it can get;
    ``shorter``: the same start and counts, the latest end that fits."""
    start: float
    end: float
    counts: tuple[tuple[int, int], ...] | None
    """(min, max) per reservation in request order; None: as requested."""
    below_request: bool
    """Some reservation gets fewer than its min."""


def counter_offers(
    placers: Sequence[Placer], search: SearchRange, begin: float, end: float, shortest: float
) -> tuple[list[Shortfall], list[CounterOffer]]:
    """Why the request does not fit in [begin, end), and what would: the earliest start in
    ``search`` (same length), the most resources in the window, the longest lease from
    ``begin`` lasting at least ``shortest`` seconds."""
    shortfalls = sorted((s for p in placers for s in p.explain(begin, end)), key=lambda s: s.index)
    offers = [
        CounterOffer("later_start", w.start, w.start + end - begin, None, False)
        for w in earliest(placers, search, 1)
    ]
    if (
        not all(s.fits for s in shortfalls)
        and all(s.available for s in shortfalls)
        and all(s.fits or s.reducible for s in shortfalls)
    ):
        counts = tuple(
            (min(s.min, s.available, s.max), min(s.max, s.available)) for s in shortfalls
        )
        below = any(low < s.min for (low, _), s in zip(counts, shortfalls, strict=True))
        offers.append(CounterOffer("fewer_hosts", begin, end, counts, below))
    until = longest(placers, begin, end, shortest)
    if until is not None:
        offers.append(CounterOffer("shorter", begin, until, None, False))
    return shortfalls, offers


def earliest(placers: Sequence[Placer], search: SearchRange, limit: int) -> list[Window]:
    """The ``limit`` earliest starts at which every placer's reservations fit at once."""
    if search.last < search.first:
        return []
    first = np.array([search.first], dtype=np.float64)
    starts = np.unique(np.concatenate([first, *(p.candidates() for p in placers)]))
    possible = np.ones(len(starts), dtype=np.bool_)
    for placer in placers:
        possible &= placer.possible(starts)
    found: list[Window] = []
    refused = 0
    for start in starts[possible].astype(np.int64).tolist():
        placements = _place_all(placers, start)
        if placements is None:
            refused += 1
            if refused == MAX_ATTEMPTS:
                break
            continue
        found.append(Window(start, start + search.duration, placements))
        if len(found) == limit:
            break
    return found


def _place_all(placers: Sequence[Placer], start: int) -> tuple[Placement, ...] | None:
    placements: list[Placement] = []
    for placer in placers:
        placed = placer.place(start)
        if placed is None:
            return None
        placements += placed
    return tuple(sorted(placements, key=lambda p: p.index))


@dataclass(frozen=True)
class HostRequest:
    index: int
    hosts: HostSet
    """The hosts matching its properties."""
    min: int
    max: int
    required: frozenset[int] = frozenset()
    """Ids it must get (a floating IP reservation's ``required_floatingips``)."""
    reducible: bool = True
    """Whether a counter-offer may lower its count (``Shortfall.reducible``)."""

    @property
    def most(self) -> int:
        """``max``, but no more than the matching hosts: the same request, in a number that
        numpy's int64 holds (a lease stored before counts were bounded may ask for 10**30)."""
        return min(self.max, len(self.hosts.ids))


class FreeCounter:
    """How many of some hosts are free for a window of ``duration`` starting at given times."""

    def __init__(self, calendar: Calendar, hosts: HostSet, search: SearchRange) -> None:
        position, starts, ends = calendar.spans_of(hosts, search.start, search.end)
        first = np.ones(len(position), dtype=np.bool_)
        first[1:] = position[1:] != position[:-1]
        last = np.ones(len(position), dtype=np.bool_)
        last[:-1] = first[1:]
        previous_end = np.where(first, -np.inf, np.roll(ends, 1))
        # Before each span, from the end of the one before it; after each host's last span.
        opens = np.concatenate((previous_end, ends[last]))
        closes = np.concatenate((starts - search.duration, np.full(int(last.sum()), np.inf)))
        usable = opens <= closes
        self._opens = np.sort(opens[usable])
        self._closes = np.sort(closes[usable])
        self._always = len(hosts.ids) - int(first.sum())
        """Hosts with no span in the range: free whenever."""
        self.ends = ends

    def at(self, starts: FloatArray) -> IntArray:
        opened = np.searchsorted(self._opens, starts, side="right")
        closed = np.searchsorted(self._closes, starts, side="left")
        counts: IntArray = (opened - closed + self._always).astype(np.int64)
        return counts


class HostPlacer:
    """The search for ``physical:host`` reservations: each takes its hosts in request order,
    with ``choose_hosts`` over what the ones before it left, as admission does."""

    def __init__(
        self, calendar: Calendar, requests: Sequence[HostRequest], search: SearchRange
    ) -> None:
        self._calendar = calendar
        self._requests = requests
        self._search = search
        # Reservations over the same hosts compete for them, in request order.
        sets: dict[bytes, list[HostRequest]] = {}
        for request in requests:
            sets.setdefault(request.hosts.ids.tobytes(), []).append(request)
        self._sets = list(sets.values())
        self._groups = [
            (FreeCounter(calendar, members[0].hosts, search), members) for members in self._sets
        ]

    def candidates(self) -> FloatArray:
        return np.concatenate([self._search.on_grid(c.ends) for c, _ in self._groups])

    def possible(self, starts: FloatArray) -> BoolArray:
        """Admission's rule on counts alone: each reservation takes as many of the hosts left
        as it may. Exact when reservations share all their hosts or none; otherwise hosts
        taken by a reservation over other hosts are not subtracted (a necessary condition)."""
        fits = np.ones(len(starts), dtype=np.bool_)
        for counter, members in self._groups:
            left = counter.at(starts)
            for request in members:
                fits &= left >= request.min
                left = left - np.minimum(left, request.most)
        return fits

    def place(self, start: int) -> list[Placement] | None:
        return self.place_window(start, start + self._search.duration)

    def place_window(self, begin: float, end: float) -> list[Placement] | None:
        taken: list[int] = []
        placed = []
        for request in self._requests:
            placement = self.take(request, begin, end, taken)
            if placement is None:
                return None
            placed.append(placement)
        return placed

    def take(
        self, request: HostRequest, begin: float, end: float, taken: list[int]
    ) -> Placement | None:
        """What admission grants ``request`` over [begin, end) besides the hosts in ``taken``
        (extended with its choice); None if it refuses."""
        begin_at, end_at = moment(begin), moment(end)
        view = self._calendar.view(request.hosts, begin_at, end_at)
        if taken:
            view = dataclasses.replace(view, free=view.free & ~np.isin(view.ids, taken))
        demand = HostDemand(
            begin_at, end_at, request.min, request.max, request.required, request.required
        )
        try:
            chosen = choose_hosts(demand, view)
        except NotEnoughCapacity:
            return None
        taken += chosen
        at = {int(view.ids[k]): k for k in np.flatnonzero(np.isin(view.ids, chosen)).tolist()}
        names = tuple(view.names[at[h]] for h in chosen)
        return Placement(request.index, tuple(chosen), names, int(np.count_nonzero(view.free)))

    def explain(self, begin: float, end: float) -> list[Shortfall]:
        taken: list[int] = []
        return [self.explain_one(request, begin, end, taken) for request in self._requests]

    def explain_one(
        self, request: HostRequest, begin: float, end: float, taken: list[int]
    ) -> Shortfall:
        """How ``request`` stands over [begin, end) besides the hosts in ``taken`` (extended
        with what admission would grant it if its min were lowered to what is left)."""
        begin_at, end_at = moment(begin), moment(end)
        view = self._calendar.view(request.hosts, begin_at, end_at)
        free = int(np.count_nonzero(view.free))
        released = tuple(np.sort(view.released[~view.free]).tolist())
        if taken:
            view = dataclasses.replace(view, free=view.free & ~np.isin(view.ids, taken))
        demand = HostDemand(begin_at, end_at, 0, request.max, request.required, request.required)
        try:
            chosen = choose_hosts(demand, view)
            available = int(np.count_nonzero(view.free))
        except NotEnoughCapacity:  # a required one is not free: nothing is granted
            chosen, available = [], 0
        taken += chosen
        return Shortfall(
            request.index,
            request.min,
            request.max,
            len(request.hosts.ids),
            free,
            available,
            released,
            request.reducible,
        )

    def cutoffs(self, begin: float, end: float) -> FloatArray:
        hosts = [request.hosts for request in self._requests]
        starts = [self._calendar.spans_of(h, begin, end)[1] for h in hosts]
        found = np.concatenate(starts)
        return found[found > begin]

    def possible_ends(self, begin: float, ends: FloatArray) -> BoolArray:
        """Admission's rule on counts alone, as ``possible``: exact when reservations share
        all their hosts or none."""
        fits = np.ones(len(ends), dtype=np.bool_)
        latest = float(ends.max(initial=begin))
        for members in self._sets:
            # Per host, until when a window from ``begin`` is free on it (``begin``: not at all).
            hosts = members[0].hosts
            position, starts, _ = self._calendar.spans_of(hosts, begin, latest)
            until = np.full(len(hosts.ids), np.inf)
            first = np.ones(len(position), dtype=np.bool_)
            first[1:] = position[1:] != position[:-1]
            until[position[first]] = np.maximum(starts[first], begin)
            order = np.sort(until)
            left = len(order) - np.searchsorted(order, ends, side="left")
            for request in members:
                fits &= left >= request.min
                left = left - np.minimum(left, request.most)
        return fits


@dataclass(frozen=True)
class Timeline:
    """Per bucket [start + i * bucket, start + (i + 1) * bucket): how many of the hosts are free
    for all of it, busy for all of it, busy for part of it."""

    start: int
    bucket: int
    hosts: int
    free: IntArray
    busy: IntArray
    partly: IntArray


def timeline(calendar: Calendar, hosts: HostSet, start: int, bucket: int, count: int) -> Timeline:
    """``count`` buckets of ``bucket`` seconds from ``start`` (seconds since the epoch)."""
    end = start + bucket * count
    position, starts, ends = calendar.spans_of(hosts, start, end)
    # Whole microseconds from the first bucket, so that bucket edges compare exactly.
    size = bucket * MICROSECONDS
    s = np.rint(starts * MICROSECONDS).astype(np.int64) - start * MICROSECONDS
    e = np.rint(ends * MICROSECONDS).astype(np.int64) - start * MICROSECONDS
    # Buckets a span touches; a host's consecutive spans may share one, counted once.
    touch_first = np.maximum(s, 0) // size
    touch_last = np.minimum((e - 1) // size, count - 1)
    same_host = np.zeros(len(position), dtype=np.bool_)
    same_host[1:] = position[1:] == position[:-1]
    touched_before = np.where(same_host, np.roll(touch_last, 1), -1)
    touched = _coverage(np.maximum(touch_first, touched_before + 1), touch_last, count)
    # Buckets inside a busy stretch: spans of a host that meet end to end make one stretch.
    joined = same_host & (s == np.roll(e, 1))
    stretch = np.cumsum(~joined) - 1
    heads = np.flatnonzero(~joined)
    stretch_end = np.zeros(len(heads), dtype=np.int64)
    np.maximum.at(stretch_end, stretch, e)
    full_first = -(-np.maximum(s[heads], 0) // size)
    full_last = np.minimum(stretch_end // size, count) - 1
    busy = _coverage(full_first, full_last, count)
    free = len(hosts.ids) - touched
    return Timeline(start, bucket, len(hosts.ids), free, busy, touched - busy)


def _coverage(first: IntArray, last: IntArray, count: int) -> IntArray:
    """Per bucket, how many of the ranges [first, last] (inclusive; empty when last < first)
    contain it."""
    keep = first <= last
    changes = np.bincount(first[keep], minlength=count + 1) - np.bincount(
        last[keep] + 1, minlength=count + 1
    )
    covered: IntArray = np.cumsum(changes[:count]).astype(np.int64)
    return covered
