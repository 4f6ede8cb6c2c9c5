"""Searching shared capacity: the level of what is held over time (``Curve``), volume GB in
storage pools, and capacity timelines of amounts.

Pure, like ``planner/availability.py``: pool uses come in as arguments. The search stays exact
for the same reason (docs/availability.md): between two consecutive ends of uses, moving a
window later only adds what starts before its new end, so what is free can only shrink; a
stretch's first grid point is the one to try.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from climate.planner.availability import BoolArray, Placement, SearchRange, Shortfall
from climate.planner.calendar import FloatArray, IntArray, moment
from climate.planner.capacity import Pool, choose_pool, peak


class Curve:
    """What is held over time (one column per resource) as a step function, answering "the
    most held at one instant of [begin, end)" for many windows at once: a sparse table of
    maxima over the levels between events, so each window costs two binary searches."""

    def __init__(self, starts: FloatArray, ends: FloatArray, amounts: IntArray) -> None:
        """``amounts``: one row per use, one column per resource."""
        keep = starts < ends
        starts, ends, held = starts[keep], ends[keep], amounts[keep]
        times = np.concatenate((starts, ends))
        # Releases sort before takes at the same instant: uses that meet do not add up.
        kinds = np.concatenate((np.ones(len(starts)), np.zeros(len(ends))))
        order = np.lexsort((kinds, times))
        self.times: FloatArray = times[order]
        deltas = np.concatenate((held, -held))[order]
        levels = np.vstack((np.zeros((1, held.shape[1]), dtype=np.int64), np.cumsum(deltas, 0)))
        table = [levels.astype(np.int64)]
        width = 1
        while 2 * width <= len(levels):
            last = table[-1]
            table.append(np.maximum(last[: len(last) - width], last[width:]))
            width *= 2
        self._table = table

    def peaks(self, begin: FloatArray, end: FloatArray) -> IntArray:
        """Per window [begin[i], end[i]) (non-empty), the most held at one instant of it."""
        # levels[k] is what is held after the first k events.
        low = np.searchsorted(self.times, begin, side="right")
        high = np.maximum(np.searchsorted(self.times, end, side="left"), low)
        # The two overlapping power-of-two runs that cover [low, high].
        power = np.floor(np.log2(high - low + 1)).astype(np.int64)
        found = np.zeros((len(low), self._table[0].shape[1]), dtype=np.int64)
        for k, rows in enumerate(self._table):
            at = np.flatnonzero(power == k)
            if len(at):
                found[at] = np.maximum(rows[low[at]], rows[high[at] - (1 << k) + 1])
        return found


# -- volume GB in pools -----------------------------------------------------------------------


@dataclass(frozen=True)
class StoragePool:
    id: int
    name: str
    capacity: int
    """GB."""
    uses: Sequence[tuple[float, float, int]]
    """(start, end, GB) held by reservations over the search range."""


@dataclass(frozen=True)
class VolumeRequest:
    index: int
    pools: tuple[int, ...]
    """The ids of the pools it may use (named, or matching its properties)."""
    size: int
    """GB in all (``amount`` x ``size_gb``)."""


def _curve(pool: StoragePool) -> Curve:
    """What is held in ``pool`` over time."""
    return Curve(
        np.array([s for s, _, _ in pool.uses], dtype=np.float64),
        np.array([e for _, e, _ in pool.uses], dtype=np.float64),
        np.array([g for _, _, g in pool.uses], dtype=np.int64).reshape(-1, 1),
    )


class VolumePlacer:
    """Volume reservations, each in one pool chosen by admission's best fit
    (``planner.capacity.choose_pool``), in request order."""

    def __init__(
        self, pools: Sequence[StoragePool], requests: Sequence[VolumeRequest], search: SearchRange
    ) -> None:
        self._pools = {p.id: p for p in pools}
        self._requests = requests
        self._search = search
        self._curves = {p.id: _curve(p) for p in pools}

    def _free(self, pool: int, begin: FloatArray, end: FloatArray) -> IntArray:
        found: IntArray = self._pools[pool].capacity - self._curves[pool].peaks(begin, end)[:, 0]
        return found

    def candidates(self) -> FloatArray:
        ends = [e for r in self._requests for p in r.pools for _, e, _ in self._pools[p].uses]
        return self._search.on_grid(np.array(ends, dtype=np.float64))

    def possible(self, starts: FloatArray) -> BoolArray:
        """Exact for one reservation; each on its own for several (a necessary condition)."""
        return self.possible_windows(starts, starts + self._search.duration)

    def possible_windows(self, begin: FloatArray, end: FloatArray) -> BoolArray:
        fits = np.ones(len(begin), dtype=np.bool_)
        for request in self._requests:
            most = np.full(len(begin), -1, dtype=np.int64)
            for pool in request.pools:
                most = np.maximum(most, self._free(pool, begin, end))
            fits &= most >= request.size
        return fits

    def place(self, start: int) -> list[Placement] | None:
        return self.place_window(start, start + self._search.duration)

    def place_window(self, begin: float, end: float) -> list[Placement] | None:
        added: list[tuple[int, float, float, int]] = []
        placed = []
        for request in self._requests:
            placement = self._take(request, begin, end, added, request.size)
            if placement is None:
                return None
            placed.append(placement)
        return placed

    def _pools_for(
        self,
        request: VolumeRequest,
        begin: float,
        end: float,
        added: list[tuple[int, float, float, int]],
    ) -> list[Pool]:
        return [
            Pool(
                p,
                self._pools[p].name,
                self._pools[p].capacity,
                [
                    (moment(s), moment(e), gb)
                    for s, e, gb in self._pools[p].uses
                    if s < end and e > begin
                ]
                + [(moment(s), moment(e), gb) for q, s, e, gb in added if q == p],
            )
            for p in request.pools
        ]

    def _take(
        self,
        request: VolumeRequest,
        begin: float,
        end: float,
        added: list[tuple[int, float, float, int]],
        size: int,
    ) -> Placement | None:
        if not request.pools:
            return None
        pools = self._pools_for(request, begin, end, added)
        fit = choose_pool(pools, size, moment(begin), moment(end))
        if fit.free < size:
            return None
        added.append((fit.pool.id, begin, end, size))
        most = _most_free(pools, begin, end)
        return Placement(request.index, (fit.pool.id,), (fit.pool.name,), most, (size,))

    def explain(self, begin: float, end: float) -> list[Shortfall]:
        """Per reservation, in GB: the largest matching pool, the most free in one of them
        (before and after the reservations before it took theirs)."""
        added: list[tuple[int, float, float, int]] = []
        found = []
        for request in self._requests:
            window = (np.array([begin]), np.array([end]))
            free = max((int(self._free(p, *window)[0]) for p in request.pools), default=0)
            available = _most_free(self._pools_for(request, begin, end, added), begin, end)
            self._take(request, begin, end, added, request.size)
            largest = max((self._pools[p].capacity for p in request.pools), default=0)
            found.append(
                Shortfall(
                    request.index,
                    request.size,
                    request.size,
                    largest,
                    max(free, 0),
                    max(available, 0),
                    (),
                    reducible=False,
                )
            )
        return found

    def cutoffs(self, begin: float, end: float) -> FloatArray:
        starts = [s for r in self._requests for p in r.pools for s, _, _ in self._pools[p].uses]
        found = np.array(starts, dtype=np.float64)
        return found[(found > begin) & (found < end)]

    def possible_ends(self, begin: float, ends: FloatArray) -> BoolArray:
        return self.possible_windows(np.full(len(ends), begin), ends)


def _most_free(pools: Sequence[Pool], begin: float, end: float) -> int:
    window = (moment(begin), moment(end))
    return max((p.capacity - peak(p.uses, *window) for p in pools), default=0)


# -- timelines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AmountTimeline:
    """Per bucket [start + i * bucket, start + (i + 1) * bucket): how much is free for all of
    it, in all and in the roomiest single resource (instances of a size: in all and on one
    host; volume GB: in all and in one pool)."""

    start: int
    bucket: int
    total: int
    """What the resources hold when nothing is booked."""
    free: IntArray
    largest: IntArray


def buckets(start: int, bucket: int, count: int) -> tuple[FloatArray, FloatArray]:
    begin = start + bucket * np.arange(count, dtype=np.float64)
    return begin, begin + bucket


def volume_timeline(
    pools: Sequence[StoragePool], start: int, bucket: int, count: int
) -> AmountTimeline:
    """Free GB per bucket in ``pools``."""
    begin, end = buckets(start, bucket, count)
    free = np.zeros(count, dtype=np.int64)
    largest = np.zeros(count, dtype=np.int64)
    for pool in pools:
        left = np.maximum(pool.capacity - _curve(pool).peaks(begin, end)[:, 0], 0)
        free += left
        largest = np.maximum(largest, left)
    return AmountTimeline(start, bucket, sum(p.capacity for p in pools), free, largest)
