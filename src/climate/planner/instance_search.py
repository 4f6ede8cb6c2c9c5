"""Searching instances packed onto hosts, together with the whole hosts of the same request,
which they exclude (``ComputePlacer``), and how many instances of a size fit over time.

Pure, like ``planner/availability.py``: whole-host spans and instance uses come in as arrays.
Exact for the same reason (docs/availability.md): between two consecutive ends of busy spans or
uses, moving a window later only adds what starts before its new end, so each host's room can
only shrink; a stretch's first grid point is the one to try.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from climate.errors import NotEnoughCapacity
from climate.planner.availability import (
    BoolArray,
    HostPlacer,
    HostRequest,
    Placement,
    SearchRange,
    Shortfall,
)
from climate.planner.calendar import Calendar, FloatArray, IntArray, moment
from climate.planner.capacity_search import AmountTimeline, buckets
from climate.planner.instances import HostRoom, InstanceDemand, Size, place

RESOURCES = 3
"""vCPUs, memory, disk: the columns of a ``Size``."""


@dataclass(frozen=True)
class InstanceHost:
    id: int
    name: str
    capacity: Size
    """Allocation ratios applied."""


@dataclass(frozen=True)
class InstanceSpace:
    """What instances are placed among: the hosts with a size matching some instance
    reservation, the spans in which each is reserved whole, and the instances already on each
    (over the search range and a look-around on both sides, which best fit reads). Spans and
    uses are parallel arrays; a host is named by its position in ``hosts``."""

    hosts: Sequence[InstanceHost]
    whole: tuple[IntArray, FloatArray, FloatArray]
    """Whole-host spans: host position, start, end."""
    uses: tuple[IntArray, FloatArray, FloatArray, IntArray]
    """Instance uses: host position, start, end, and what each uses (vCPUs, memory, disk)."""
    lookaround: float = 86_400.0

    @classmethod
    def of(
        cls,
        hosts: Sequence[InstanceHost],
        whole: Sequence[tuple[int, float, float]],
        uses: Sequence[tuple[int, float, float, Size]],
        lookaround: float = 86_400.0,
    ) -> InstanceSpace:
        """From spans (host id, start, end) and uses (host id, start, end, size), leaving out
        those of other hosts."""
        at = {h.id: k for k, h in enumerate(hosts)}
        spans = [(at[h], s, e) for h, s, e in whole if h in at]
        used = [(at[h], s, e, *u.as_tuple()) for h, s, e, u in uses if h in at]
        table = np.array(spans, dtype=np.float64).reshape(-1, 3)
        rows = np.array(used, dtype=np.float64).reshape(-1, 3 + RESOURCES)
        return cls(
            hosts,
            (table[:, 0].astype(np.int64), table[:, 1], table[:, 2]),
            (rows[:, 0].astype(np.int64), rows[:, 1], rows[:, 2], rows[:, 3:].astype(np.int64)),
            lookaround,
        )


@dataclass(frozen=True)
class InstanceRequest:
    index: int
    hosts: frozenset[int]
    """The ids of the hosts with a size matching its properties."""
    size: Size
    amount: int
    affinity: bool | None


def whole_spans(
    position: IntArray,
    starts: FloatArray,
    ends: FloatArray,
    use_position: IntArray,
    use_starts: FloatArray,
    use_ends: FloatArray,
) -> BoolArray:
    """Which of a host calendar's spans (by host position) are reservations of whole hosts:
    those no instance use of their host overlaps (the calendar shows each host's instance usage
    as spans too, and whole hosts never overlap instances). The uses must include every one
    overlapping the spans' part of the range read."""
    if not len(use_position) or not len(position):
        return np.ones(len(position), dtype=np.bool_)
    # One sorted axis for all hosts: host k's times shifted into a band of its own (a time
    # and its copy shift alike, so equal times stay equal).
    low = min(float(starts.min()), float(use_starts.min()))
    band = max(float(ends.max()), float(use_ends.max())) - low + 1.0
    shift_uses = use_position * band - low
    order = np.argsort(use_starts + shift_uses, kind="stable")
    use_begin = (use_starts + shift_uses)[order]
    latest_end = np.maximum.accumulate((use_ends + shift_uses)[order])
    shift = position * band - low
    before = np.searchsorted(use_begin, ends + shift, side="left") - 1
    overlapped = (before >= 0) & (latest_end[np.maximum(before, 0)] > starts + shift)
    found: BoolArray = ~overlapped
    return found


def measure(room: IntArray, affinity: bool | None) -> int:
    """How many instances fit, given each host's room, under ``affinity``: anywhere (the sum),
    all on one host (the largest), each on its own host (hosts with room)."""
    if affinity is None:
        return int(room.sum())
    if affinity:
        return int(room.max(initial=0))
    return int(np.count_nonzero(room))


class ComputePlacer:
    """Whole hosts and instances of one request, placed in request order as admission does:
    a host taken whole is no candidate for instances, a host given instances is not free to be
    taken whole, and instances of earlier reservations use room on their hosts."""

    def __init__(
        self,
        calendar: Calendar,
        hosts: Sequence[HostRequest],
        space: InstanceSpace,
        instances: Sequence[InstanceRequest],
        search: SearchRange,
    ) -> None:
        self._whole = HostPlacer(calendar, hosts, search) if hosts else None
        self._order: list[HostRequest | InstanceRequest] = sorted(
            [*hosts, *instances], key=lambda r: r.index
        )
        self._instances = instances
        self._search = search
        self._lookaround = space.lookaround
        self._ids = np.array([h.id for h in space.hosts], dtype=np.int64)
        self._names = [h.name for h in space.hosts]
        self._capacity = np.array(
            [h.capacity.as_tuple() for h in space.hosts], dtype=np.int64
        ).reshape(-1, RESOURCES)
        self._sizes = [h.capacity for h in space.hosts]
        self._position = {h.id: k for k, h in enumerate(space.hosts)}
        at, starts, ends = space.whole
        order = np.lexsort((starts, at))
        self._whole_at, self._whole_start, self._whole_end = at[order], starts[order], ends[order]
        self._use_at, self._use_start, self._use_end, self._use_size = space.uses

    def _members(self, request: InstanceRequest) -> BoolArray:
        return np.isin(self._ids, list(request.hosts))

    def _empty_room(self, size: Size) -> IntArray:
        wanted = np.array(size.as_tuple(), dtype=np.int64)
        sized = wanted > 0
        room: IntArray = (self._capacity[:, sized] // wanted[sized]).min(axis=1, initial=2**62)
        return room

    # -- the search --------------------------------------------------------------------------

    def candidates(self) -> FloatArray:
        ends = [self._search.on_grid(self._whole_end), self._search.on_grid(self._use_end)]
        if self._whole is not None:
            ends.append(self._whole.candidates())
        return np.concatenate(ends)

    def possible(self, starts: FloatArray) -> BoolArray:
        """Whole hosts as ``HostPlacer.possible``; instances on an upper bound: the room of
        the matching hosts not reserved whole anywhere in the window, as if they held no
        instances (a necessary condition, checked by ``place``)."""
        fits = np.ones(len(starts), dtype=np.bool_)
        if self._whole is not None:
            fits &= self._whole.possible(starts)
        for request in self._instances:
            room = np.where(self._members(request), self._empty_room(request.size), 0)
            if request.affinity is None:
                weights, needed = room, request.amount
            elif request.affinity:
                weights, needed = (room >= request.amount).astype(np.int64), 1
            else:
                weights, needed = (room >= 1).astype(np.int64), request.amount
            fits &= self._whole_free_weight(weights, starts, self._search.duration) >= needed
        return fits

    def _whole_free_weight(
        self, weights: IntArray, starts: FloatArray, duration: float
    ) -> IntArray:
        """Per start, the summed weights of the hosts no whole-host span touches over
        [start, start + duration) (as ``FreeCounter``, weighted)."""
        at, s, e = self._whole_at, self._whole_start, self._whole_end
        first = np.ones(len(at), dtype=np.bool_)
        first[1:] = at[1:] != at[:-1]
        last = np.ones(len(at), dtype=np.bool_)
        last[:-1] = first[1:]
        opens = np.concatenate((np.where(first, -np.inf, np.roll(e, 1)), e[last]))
        closes = np.concatenate((s - duration, np.full(int(last.sum()), np.inf)))
        weight = np.concatenate((weights[at], weights[at[last]]))
        usable = opens <= closes
        order = np.argsort(opens[usable])
        opened = np.concatenate(([0], np.cumsum(weight[usable][order])))
        sorted_opens = opens[usable][order]
        order = np.argsort(closes[usable])
        closed = np.concatenate(([0], np.cumsum(weight[usable][order])))
        sorted_closes = closes[usable][order]
        spanned = np.zeros(len(weights), dtype=np.bool_)
        spanned[at] = True
        always = int(weights[~spanned].sum())
        found: IntArray = (
            opened[np.searchsorted(sorted_opens, starts, side="right")]
            - closed[np.searchsorted(sorted_closes, starts, side="left")]
            + always
        )
        return found

    def place(self, start: int) -> list[Placement] | None:
        return self.place_window(start, start + self._search.duration)

    def place_window(self, begin: float, end: float) -> list[Placement] | None:
        whole: list[int] = []
        with_instances: list[int] = []
        added: list[tuple[int, float, float, Size]] = []
        placed = []
        for request in self._order:
            if isinstance(request, HostRequest):
                assert self._whole is not None
                placement = self._whole.take(request, begin, end, [*whole, *with_instances])
                if placement is not None:
                    whole += placement.resources
            else:
                placement = self._take(request, begin, end, whole, added)
                if placement is not None:
                    with_instances += placement.resources
            if placement is None:
                return None
            placed.append(placement)
        return placed

    def _room(
        self,
        request: InstanceRequest,
        begin: float,
        end: float,
        whole: list[int],
        added: list[tuple[int, float, float, Size]],
    ) -> IntArray:
        """Per host, how many instances of the request's size it takes over [begin, end):
        none on hosts that do not match or are reserved whole (before or by this request)."""
        members = self._members(request) & ~np.isin(self._ids, whole)
        touching = (self._whole_start < end) & (self._whole_end > begin)
        members[self._whole_at[touching]] = False
        inside = (self._use_start < end) & (self._use_end > begin)
        at = self._use_at[inside]
        starts, ends = self._use_start[inside], self._use_end[inside]
        sizes = self._use_size[inside]
        if added:
            at = np.concatenate((at, [self._position[h] for h, _, _, _ in added])).astype(np.int64)
            starts = np.concatenate((starts, [s for _, s, _, _ in added]))
            ends = np.concatenate((ends, [e for _, _, e, _ in added]))
            sizes = np.vstack((sizes, [u.as_tuple() for _, _, _, u in added]))
        peaks = _peaks(at, np.maximum(starts, begin), np.minimum(ends, end), sizes, len(self._ids))
        wanted = np.array(request.size.as_tuple(), dtype=np.int64)
        sized = wanted > 0
        free = np.maximum(self._capacity - peaks, 0)
        room = (free[:, sized] // wanted[sized]).min(axis=1, initial=2**62)
        found: IntArray = np.where(members, room, 0)
        return found

    def _take(
        self,
        request: InstanceRequest,
        begin: float,
        end: float,
        whole: list[int],
        added: list[tuple[int, float, float, Size]],
        amount: int | None = None,
    ) -> Placement | None:
        """Admission's placement (``planner.instances.place``) of ``amount`` (the request's,
        by default) among the hosts left; ``added`` gets what it placed."""
        room = self._room(request, begin, end, whole, added)
        wanted = request.amount if amount is None else amount
        if measure(room, request.affinity) < wanted:
            return None  # what ``place`` would refuse, without building its rooms
        able = np.flatnonzero(room > 0).tolist()
        near = (self._use_start < end + self._lookaround) & (
            self._use_end > begin - self._lookaround
        )
        around: dict[int, list[tuple[float, float, Size]]] = {}
        for k, s, e, size in zip(
            self._use_at[near].tolist(),
            self._use_start[near].tolist(),
            self._use_end[near].tolist(),
            self._use_size[near].tolist(),
            strict=True,
        ):
            around.setdefault(k, []).append((s, e, Size(*size)))
        for host, s, e, size in added:
            around.setdefault(self._position[host], []).append((s, e, size))
        rooms = [
            HostRoom(
                int(self._ids[k]),
                self._names[k],
                self._sizes[k],
                [(moment(s), moment(e), u) for s, e, u in around.get(k, ())],
            )
            for k in able
        ]
        demand = InstanceDemand(moment(begin), moment(end), wanted, request.size, request.affinity)
        try:
            chosen = place(demand, rooms)
        except NotEnoughCapacity:
            return None
        hosts = sorted(chosen)
        for host in hosts:
            added.append((host, begin, end, request.size.times(chosen[host])))
        return Placement(
            request.index,
            tuple(hosts),
            tuple(self._names[self._position[h]] for h in hosts),
            measure(room, request.affinity),
            tuple(chosen[h] for h in hosts),
        )

    def explain(self, begin: float, end: float) -> list[Shortfall]:
        """Per reservation, in its own units (hosts; instances of its size)."""
        whole: list[int] = []
        with_instances: list[int] = []
        added: list[tuple[int, float, float, Size]] = []
        found = []
        for request in self._order:
            if isinstance(request, HostRequest):
                assert self._whole is not None
                taken = [*whole, *with_instances]
                shortfall = self._whole.explain_one(request, begin, end, taken)
                whole += taken[len(whole) + len(with_instances) :]
            else:
                members = self._members(request)
                matching = measure(
                    np.where(members, self._empty_room(request.size), 0), request.affinity
                )
                free = measure(self._room(request, begin, end, [], []), request.affinity)
                available = measure(self._room(request, begin, end, whole, added), request.affinity)
                granted = min(available, request.amount)
                if granted:
                    placement = self._take(request, begin, end, whole, added, granted)
                    if placement is not None:
                        with_instances += placement.resources
                shortfall = Shortfall(
                    request.index, request.amount, request.amount, matching, free, available, ()
                )
            found.append(shortfall)
        return found

    def cutoffs(self, begin: float, end: float) -> FloatArray:
        starts = np.concatenate((self._whole_start, self._use_start))
        found = [starts[(starts > begin) & (starts < end)]]
        if self._whole is not None:
            found.append(self._whole.cutoffs(begin, end))
        return np.concatenate(found)

    def possible_ends(self, begin: float, ends: FloatArray) -> BoolArray:
        """Whole hosts as ``HostPlacer.possible_ends``; instances are checked by placing."""
        if self._whole is None:
            return np.ones(len(ends), dtype=np.bool_)
        return self._whole.possible_ends(begin, ends)


def _peaks(
    at: IntArray, starts: FloatArray, ends: FloatArray, sizes: IntArray, count: int
) -> IntArray:
    """Per position (of ``count``), the most its uses (clipped already) hold at one instant:
    one sweep over every position together, as ``planner.instances`` does per window."""
    peaks = np.zeros((count, RESOURCES), dtype=np.int64)
    keep = starts < ends
    at, starts, ends, sizes = at[keep], starts[keep], ends[keep], sizes[keep]
    if not len(at):
        return peaks
    where = np.concatenate((at, at))
    times = np.concatenate((starts, ends))
    kinds = np.concatenate((np.ones(len(at)), np.zeros(len(at))))
    deltas = np.concatenate((sizes, -sizes))
    order = np.lexsort((kinds, times, where))
    levels = np.cumsum(deltas[order], axis=0)
    np.maximum.at(peaks, where[order], levels)
    return peaks


def _bucket_peaks(
    uses: tuple[IntArray, FloatArray, FloatArray, IntArray],
    begin: FloatArray,
    start: int,
    bucket: int,
) -> tuple[IntArray, IntArray]:
    """The hosts that hold ``uses`` (positions, sorted) and, per such host and bucket (shape:
    hosts, buckets, resources), the most they hold at one instant of the bucket: what is held
    at its start, or just after a use starts or ends inside it. One pass over every host's
    uses in time order, whatever they span."""
    count = len(begin)
    at, starts, ends, sizes = uses
    keep = starts < ends
    at, starts, ends, sizes = at[keep], starts[keep], ends[keep], sizes[keep]
    used, at = np.unique(at, return_inverse=True)
    if not len(used):
        return used, np.zeros((0, count, RESOURCES), dtype=np.int64)
    # Times as ranks among every time in play: (host, time) keys in one integer, exactly.
    times = np.concatenate((starts, ends))
    values, rank = np.unique(np.concatenate((times, begin)), return_inverse=True)
    where = np.concatenate((at, at))
    kinds = np.concatenate((np.ones(len(at)), np.zeros(len(at))))
    keys = where * len(values) + rank[: len(times)]
    # Releases sort before takes at the same instant: uses that meet do not add up.
    order = np.lexsort((kinds, keys))
    changes = np.concatenate((sizes, -sizes))[order]
    levels = np.vstack((np.zeros((1, RESOURCES), dtype=np.int64), np.cumsum(changes, 0)))
    # Each host's level at each bucket's start (every host's uses end, so each host's
    # running sum starts from zero).
    grid = np.arange(len(used))[:, None] * len(values) + rank[len(times) :][None, :]
    peaks = levels[np.searchsorted(keys[order], grid.ravel(), side="right")]
    # Then the level after each change strictly inside a bucket (a change at a bucket's very
    # start is in the level there already; between its release and its take the level is
    # the one before the bucket).
    when = times[order]
    into = np.floor((when - start) / bucket).astype(np.int64)
    inside = (into >= 0) & (into < count)
    inside[inside] &= when[inside] > begin[into[inside]]
    np.maximum.at(peaks, where[order][inside] * count + into[inside], levels[1:][inside])
    return used, peaks.reshape(len(used), count, RESOURCES)


def instance_timeline(
    space: InstanceSpace, size: Size, start: int, bucket: int, count: int
) -> AmountTimeline:
    """How many instances of ``size`` the hosts of ``space`` take for all of each bucket,
    anywhere and on one host: every host and bucket at once (``_bucket_peaks``)."""
    begin, _ = buckets(start, bucket, count)
    hosts = len(space.hosts)
    wanted = np.array(size.as_tuple(), dtype=np.int64)
    sized = wanted > 0
    capacity = np.array([h.capacity.as_tuple() for h in space.hosts], dtype=np.int64)
    capacity = capacity.reshape(hosts, RESOURCES)[:, sized]
    empty = (capacity // wanted[sized]).min(axis=1, initial=2**62)
    room = np.repeat(empty[:, None], count, axis=1)
    used, peaks = _bucket_peaks(space.uses, begin, start, bucket)
    if len(used):
        left = np.maximum(capacity[used][:, None, :] - peaks[:, :, sized], 0)
        room[used] = (left // wanted[sized]).min(axis=2, initial=2**62)
    # Buckets a host is reserved whole in, any part of them, take none.
    whole_at, whole_start, whole_end = space.whole
    cut_from = np.clip(np.floor((whole_start - start) / bucket), 0, count).astype(np.int64)
    cut_to = np.clip(np.ceil((whole_end - start) / bucket), 0, count).astype(np.int64)
    cuts = cut_from < cut_to
    blocked = np.zeros((hosts, count + 1), dtype=np.int64)
    np.add.at(blocked, (whole_at[cuts], cut_from[cuts]), 1)
    np.add.at(blocked, (whole_at[cuts], cut_to[cuts]), -1)
    room[np.cumsum(blocked, axis=1)[:, :count] > 0] = 0
    free = room.sum(axis=0, dtype=np.int64)
    largest = room.max(axis=0, initial=0)
    return AmountTimeline(start, bucket, int(empty.sum()), free, largest)
