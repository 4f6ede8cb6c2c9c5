"""Busy spans of every host, packed so that one decision looks at all hosts at once.

Spans of one host never overlap (that is the invariant admission keeps), so sorted by start they
are sorted by end too. Every host owns a slab of three parallel arrays (start, end, owner) with
room to spare: adding or dropping a span shifts only that host's spans, and a full slab moves to
the end of the arrays with twice the room. Viewing H hosts around a window is then one binary
search run for all of them together, about log2(spans per host) steps of array operations over H
elements, instead of H Python loops; a small calendar is counted in one pass instead
(``COUNTING_MOST``). Times are float seconds since the epoch: compact, and compared without
timezone arithmetic.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from climate.planner.hosts import OPEN_GAP, HostCalendar, HostsView

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MICROSECONDS = 1e6
OPEN_GAP_US = OPEN_GAP // dt.timedelta(microseconds=1)
_PAD = 1
"""The arrays start with one unused entry, so that "the span before a slab's first" is always a
valid index (its value is masked out)."""
_MIN_ROOM = 4
COUNTING_MOST = 4096
"""Up to this many array entries, a view counts the spans before a window in one pass over all
of them; beyond, it searches each host's slab (binary lifting). Measured: counting is 3.5x
faster for 100 hosts of 35 spans each, and slower from about 10,000 entries."""
_Held = tuple[int, float, float]
"""A span without its owner: host, start, end."""


def seconds(when: dt.datetime) -> float:
    return when.timestamp()


def moment(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, dt.UTC)


def gap_us(gap: float | None) -> int:
    """A free gap in whole microseconds (as datetimes would give it), OPEN_GAP if unbounded."""
    return OPEN_GAP_US if gap is None else round(gap * MICROSECONDS)


@dataclass(frozen=True)
class Span:
    host_id: int
    start: float
    end: float
    owner: str
    """The reservation holding the host."""


class HostSet:
    """Hosts to view (id, name), with their ids as an array: built once per property query."""

    def __init__(self, hosts: Iterable[tuple[int, str]]) -> None:
        pairs = list(hosts)
        self.ids: IntArray = np.array([h for h, _ in pairs], dtype=np.int64)
        self.names = [name for _, name in pairs]
        self.slots: tuple[object, IntArray] | None = None
        """Where these hosts are in the calendar that viewed them last, and in which layout."""


@dataclass(frozen=True)
class _Around:
    """One host's spans around a window, read span by span (excluded owners skipped)."""

    busy: list[tuple[float, float]]
    previous_end: float | None
    next_start: float | None

    def fit_us(self, s: float, e: float) -> int:
        before = None if self.previous_end is None else s - self.previous_end
        after = None if self.next_start is None else self.next_start - e
        return gap_us(before) + gap_us(after)


class Calendar:
    """Busy spans of every host, with their owning reservation."""

    def __init__(self) -> None:
        self._slot_of: dict[int, int] = {}
        # Per slot (host): where its slab starts, how many spans it holds, how many it can hold.
        # Slot 0 is every host without spans: empty, so it is never read.
        self._offset: IntArray = np.full(1, _PAD, dtype=np.int64)
        self._count: IntArray = np.zeros(1, dtype=np.int64)
        self._room: IntArray = np.zeros(1, dtype=np.int64)
        self._slots = 1
        self._starts: FloatArray = np.zeros(_PAD, dtype=np.float64)
        self._ends: FloatArray = np.zeros(_PAD, dtype=np.float64)
        self._owners: IntArray = np.zeros(_PAD, dtype=np.int64)
        self._used = _PAD
        self._code_of: dict[str, int] = {}
        self._owner_of: list[str] = []
        self._free_codes: list[int] = []
        # Tuples of numbers only: the garbage collector stops tracking them, so a calendar of a
        # million spans does not make every full collection walk a million objects.
        self._by_owner: dict[str, tuple[_Held, ...]] = {}
        self._lookup: tuple[IntArray, IntArray] | None = None
        self._generation = 0

    @classmethod
    def of(cls, spans: Iterable[Span]) -> Calendar:
        """A calendar holding ``spans``, laid out in one pass (loading is not span by span)."""
        calendar = cls()
        listed = [s for s in spans if s.start < s.end]  # see ``add``
        grouped: dict[str, list[_Held]] = {}
        for span in listed:
            grouped.setdefault(span.owner, []).append((span.host_id, span.start, span.end))
            calendar._slot(span.host_id)
        calendar._by_owner = {owner: tuple(held) for owner, held in grouped.items()}
        if not listed:
            return calendar
        slots = np.array([calendar._slot_of[s.host_id] for s in listed], dtype=np.int64)
        starts = np.array([s.start for s in listed], dtype=np.float64)
        ends = np.array([s.end for s in listed], dtype=np.float64)
        owners = np.array([calendar._code(s.owner) for s in listed], dtype=np.int64)
        order = np.lexsort((starts, slots))
        counts = np.bincount(slots, minlength=calendar._slots)
        room = np.maximum(counts + counts // 2, _MIN_ROOM)
        room[0] = 0
        offset = _PAD + np.concatenate(([0], np.cumsum(room)[:-1]))
        size = _PAD + int(room.sum())
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        sorted_slots = slots[order]
        where = offset[sorted_slots] + np.arange(len(listed)) - first[sorted_slots]
        calendar._starts = np.zeros(size, dtype=np.float64)
        calendar._ends = np.zeros(size, dtype=np.float64)
        calendar._owners = np.zeros(size, dtype=np.int64)
        calendar._starts[where] = starts[order]
        calendar._ends[where] = ends[order]
        calendar._owners[where] = owners[order]
        calendar._offset, calendar._count, calendar._room = offset, counts, room
        calendar._used = size
        return calendar

    # -- changes -----------------------------------------------------------------------------

    def add(self, span: Span) -> None:
        if span.end <= span.start:
            # An allocation cut at its start (a lease deleted as it began) holds nothing; kept, it
            # would break the order of the host's ends that every overlap search bisects.
            return
        self._generation += 1
        slot = self._slot(span.host_id)
        offset, count = int(self._offset[slot]), int(self._count[slot])
        if count == self._room[slot]:
            offset = self._move(slot, max(_MIN_ROOM, 2 * count))
        stop = offset + count
        i = offset + bisect_left(self._starts[offset:stop], span.start)
        for values, value in (
            (self._starts, span.start),
            (self._ends, span.end),
            (self._owners, self._code(span.owner)),
        ):
            values[i + 1 : stop + 1] = values[i:stop]
            values[i] = value
        self._count[slot] = count + 1
        held = (span.host_id, span.start, span.end)
        self._by_owner[span.owner] = (*self._by_owner.get(span.owner, ()), held)

    def drop_owner(self, owner: str) -> list[Span]:
        """Remove every span of ``owner``; returns them (to put back on rollback)."""
        self._generation += 1
        spans = [Span(*held, owner) for held in self._by_owner.pop(owner, ())]
        code = self._code_of.get(owner)
        for span in spans:
            slot = self._slot_of[span.host_id]
            offset, count = int(self._offset[slot]), int(self._count[slot])
            stop = offset + count
            i = offset + bisect_left(self._starts[offset:stop], span.start)
            while self._owners[i] != code:
                i += 1
            for values in (self._starts, self._ends, self._owners):
                values[i : stop - 1] = values[i + 1 : stop]
            self._count[slot] = count - 1
        if code is not None:
            del self._code_of[owner]
            self._free_codes.append(code)
        return spans

    def _slot(self, host_id: int) -> int:
        slot = self._slot_of.get(host_id)
        if slot is None:
            slot = self._slots
            if slot == len(self._offset):
                grown = 2 * slot
                self._offset = np.resize(self._offset, grown)
                self._count = np.resize(self._count, grown)
                self._room = np.resize(self._room, grown)
            self._offset[slot] = self._used
            self._count[slot] = self._room[slot] = 0
            self._slots += 1
            self._slot_of[host_id] = slot
            self._lookup = None
        return slot

    def _code(self, owner: str) -> int:
        code = self._code_of.get(owner)
        if code is None:
            if self._free_codes:
                code = self._free_codes.pop()
                self._owner_of[code] = owner
            else:
                code = len(self._owner_of)
                self._owner_of.append(owner)
            self._code_of[owner] = code
        return code

    def _move(self, slot: int, room: int) -> int:
        """Give ``slot`` a slab of ``room`` at the end of the arrays; returns its offset.

        The slab left behind is not reused: room doubles at each move, so what is left behind
        is always less than the room in use.
        """
        if self._used + room > len(self._starts):
            size = max(2 * len(self._starts), self._used + room)
            self._starts = np.resize(self._starts, size)
            self._ends = np.resize(self._ends, size)
            self._owners = np.resize(self._owners, size)
        offset, count = int(self._offset[slot]), int(self._count[slot])
        for values in (self._starts, self._ends, self._owners):
            values[self._used : self._used + count] = values[offset : offset + count]
        self._offset[slot], self._room[slot] = self._used, room
        self._used += room
        return self._used - room

    # -- reading -----------------------------------------------------------------------------

    @property
    def by_owner(self) -> Mapping[str, tuple[tuple[int, float, float], ...]]:
        """Every owner's spans: host, start, end (read-only)."""
        return self._by_owner

    def overlapping(self, host_id: int, start: float, end: float) -> list[Span]:
        """The spans of ``host_id`` overlapping [start, end)."""
        slot = self._slot_of.get(host_id)
        if slot is None:
            return []
        offset, count = int(self._offset[slot]), int(self._count[slot])
        starts = self._starts[offset : offset + count].tolist()
        ends = self._ends[offset : offset + count].tolist()
        owners = self._owners[offset : offset + count].tolist()
        first = bisect_right(ends, start)
        after = bisect_left(starts, end)
        return [
            Span(host_id, starts[i], ends[i], self._owner_of[owners[i]])
            for i in range(first, after)
        ]

    def view(
        self,
        hosts: HostSet | Iterable[tuple[int, str]],
        start: dt.datetime,
        end: dt.datetime,
        exclude: Collection[str] = (),
        lookaround: float = 86400.0,
    ) -> HostsView:
        """The planner's view of ``hosts`` (id, name) around [start, end), ignoring ``exclude``.

        Free, fit and release time come out of array operations over all hosts together; a
        host's full calendar is only built when asked for (``HostsView.detail``).
        """
        if not isinstance(hosts, HostSet):
            hosts = HostSet(hosts)
        s, e = seconds(start), seconds(end)
        slots = self._slots_of(hosts)
        offset, count = self._offset[slots], self._count[slots]
        # How many spans of each host start before the window ends. The last of them is the
        # only one that can overlap the window (ends are sorted too), and when it does not, it
        # and the next one are the window's neighbours.
        before_end = self._started_before(e, offset, count)
        has_previous = before_end > 0
        has_next = before_end < count
        last_end = self._ends[offset + before_end - 1]
        next_start = self._starts[np.minimum(offset + before_end, len(self._starts) - 1)]
        free = ~(has_previous & (last_end > s))
        gap_before, gap_after = s - last_end, next_start - e
        fit = np.where(
            has_previous & (gap_before <= lookaround),
            np.rint(gap_before * MICROSECONDS),
            OPEN_GAP_US,
        ) + np.where(
            has_next & (gap_after <= lookaround), np.rint(gap_after * MICROSECONDS), OPEN_GAP_US
        )
        fit_us = fit.astype(np.int64)
        excluded = frozenset(self._code_of[o] for o in exclude if o in self._code_of)
        touched = [host for o in exclude for host, _, _ in self._by_owner.get(o, ())]
        for k in np.flatnonzero(np.isin(hosts.ids, touched)).tolist() if touched else ():
            around = self._around(int(slots[k]), s, e, excluded, lookaround)
            free[k] = not around.busy
            fit_us[k] = around.fit_us(s, e)
            if around.busy:
                last_end[k] = around.busy[-1][1]
        generation = self._generation

        def detail(k: int) -> HostCalendar:
            if self._generation != generation:
                raise RuntimeError("the calendar changed since this view was taken")
            around = self._around(int(slots[k]), s, e, excluded, lookaround)
            return HostCalendar(
                host_id=int(hosts.ids[k]),
                name=hosts.names[k],
                busy=tuple((moment(a), moment(b)) for a, b in around.busy),
                previous_end=None if around.previous_end is None else moment(around.previous_end),
                next_start=None if around.next_start is None else moment(around.next_start),
            )

        return HostsView(hosts.ids, hosts.names, free, fit_us, last_end, detail)

    def _started_before(self, e: float, offset: IntArray, count: IntArray) -> IntArray:
        """Per slab (``offset``, ``count``), how many of its spans start before ``e``."""
        if self._used <= COUNTING_MOST:
            # One pass over every slab at once: a running count of the spans starting before
            # ``e``, read at each slab's two ends (slack between slabs cancels out).
            running = np.zeros(self._used + 1, dtype=np.int64)
            np.cumsum(self._starts[: self._used] < e, out=running[1:])
            started: IntArray = running[offset + count] - running[offset]
            return started
        # Binary lifting, all slabs in step: about log2(spans per host) rounds over the hosts.
        started = np.zeros(len(offset), dtype=np.int64)
        step = 1 << max(int(count.max(initial=0)).bit_length() - 1, 0)
        while step:
            tried = started + step
            fits = tried <= count
            fits &= self._starts[offset + np.minimum(tried, count) - 1] < e
            started += fits * step
            step >>= 1
        return started

    def spans_of(
        self, hosts: HostSet, start: float, end: float
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """The spans of ``hosts`` overlapping [start, end) as three arrays: the host's position
        in ``hosts``, start, end; ordered by position, then start (read-only)."""
        position, at = self._within(hosts, start, end)
        return position, self._starts[at], self._ends[at]

    def _within(self, hosts: HostSet, start: float, end: float) -> tuple[IntArray, IntArray]:
        """The spans of ``hosts`` overlapping [start, end): their host's position in ``hosts``
        and their index in the arrays."""
        slots = self._slots_of(hosts)
        count = self._count[slots]
        position = np.repeat(np.arange(len(slots), dtype=np.int64), count)
        first = np.cumsum(count) - count
        at = self._offset[slots][position] + np.arange(len(position)) - first[position]
        keep = (self._starts[at] < end) & (self._ends[at] > start)
        return position[keep], at[keep]

    def owners_within(self, hosts: HostSet, start: float, end: float) -> list[tuple[int, str]]:
        """The spans of ``hosts`` overlapping [start, end) as their host's position in
        ``hosts`` and their owner."""
        position, at = self._within(hosts, start, end)
        owner_of = self._owner_of
        codes = self._owners[at].tolist()
        return [(p, owner_of[c]) for p, c in zip(position.tolist(), codes, strict=True)]

    def taken(
        self, hosts: HostSet, start: float, end: float, exclude: Collection[str] = ()
    ) -> tuple[FloatArray, FloatArray, IntArray]:
        """The starts, ends and owners (as codes: equal for one owner) of the spans of ``hosts``
        overlapping [start, end), but those of ``exclude``: what keeps hosts busy in a window,
        in one pass over all of them."""
        _, at = self._within(hosts, start, end)
        excluded = [self._code_of[o] for o in exclude if o in self._code_of]
        if excluded:
            at = at[~np.isin(self._owners[at], excluded)]
        return self._starts[at], self._ends[at], self._owners[at]

    def counts(self, hosts: HostSet, start: float, end: float) -> IntArray:
        """How many spans each of ``hosts`` has overlapping [start, end), in their order."""
        position, _, _ = self.spans_of(hosts, start, end)
        return np.bincount(position, minlength=len(hosts.ids))

    def free_somewhere(
        self, hosts: HostSet, starts: FloatArray, ends: FloatArray, exclude: Collection[str] = ()
    ) -> BoolArray:
        """For each window [starts[i], ends[i]), whether some host of ``hosts`` has no span
        overlapping it but those of ``exclude``: one pass over their spans for every window."""
        if not len(hosts.ids) or not len(starts):
            return np.zeros(len(starts), dtype=np.bool_)
        # Only spans overlapping the windows' hull can keep a host busy in one of them; the
        # others lie beyond the gaps that matter.
        position, at = self._within(hosts, float(starts.min()), float(ends.max()))
        position, at = self._without(position, at, exclude)
        # The gaps of each host: before its first span, between two spans, after its last.
        first = np.flatnonzero(np.diff(position, prepend=-1))
        if len(first) < len(hosts.ids):  # a host without spans there is free in every window
            return np.ones(len(starts), dtype=np.bool_)
        span_starts, span_ends = self._starts[at], self._ends[at]
        same_host = np.append(position[1:] == position[:-1], False)
        gap_starts = np.concatenate((np.full(len(first), -np.inf), span_ends))
        gap_ends = np.concatenate(
            (span_starts[first], np.where(same_host, np.append(span_starts[1:], 0.0), np.inf))
        )
        order = np.argsort(gap_starts, kind="stable")
        # A window fits a gap opening at or before its start that closes at or after its end.
        latest_close = np.maximum.accumulate(gap_ends[order])
        opened = np.searchsorted(gap_starts[order], starts, side="right") - 1
        fits: BoolArray = (opened >= 0) & (latest_close[np.maximum(opened, 0)] >= ends)
        return fits

    def straight(
        self, hosts: HostSet, start: float, end: float, most: int, exclude: Collection[str] = ()
    ) -> IntArray:
        """The hosts of ``hosts`` with at most ``most`` spans overlapping [start, end), each
        of which fits where some host of ``hosts`` has no span, fewest spans first, then by id
        (spans of ``exclude`` are not there): where a window could be cleared by moving spans
        straight to free hosts among ``hosts`` (``planner.repack.Straight``)."""
        position, at = self._without(*self._within(hosts, start, end), exclude)
        size = len(hosts.ids)
        held = np.bincount(position, minlength=size)
        stuck = ~self.free_somewhere(hosts, self._starts[at], self._ends[at], exclude)
        fit = (held <= most) & (np.bincount(position[stuck], minlength=size) == 0)
        order = np.lexsort((hosts.ids[fit], held[fit]))
        found: IntArray = hosts.ids[fit][order]
        return found

    def _without(
        self, position: IntArray, at: IntArray, exclude: Collection[str]
    ) -> tuple[IntArray, IntArray]:
        excluded = [self._code_of[o] for o in exclude if o in self._code_of]
        if not excluded:
            return position, at
        keep = ~np.isin(self._owners[at], excluded)
        return position[keep], at[keep]

    def _slots_of(self, hosts: HostSet) -> IntArray:
        """The slot of each host (0 for hosts without spans); remembered by ``hosts`` until a
        host gets its first span."""
        if self._lookup is None:
            known = np.array(list(self._slot_of), dtype=np.int64)
            order = np.argsort(known)
            slots = np.array(list(self._slot_of.values()), dtype=np.int64)
            self._lookup = (known[order], slots[order])
        if hosts.slots is not None and hosts.slots[0] is self._lookup:
            return hosts.slots[1]
        known, slots = self._lookup
        if len(known):
            at = np.minimum(np.searchsorted(known, hosts.ids), len(known) - 1)
            found = np.where(known[at] == hosts.ids, slots[at], 0)
        else:
            found = np.zeros(len(hosts.ids), dtype=np.int64)
        hosts.slots = (self._lookup, found)
        return found

    def _around(
        self, slot: int, s: float, e: float, excluded: frozenset[int], lookaround: float
    ) -> _Around:
        offset, count = int(self._offset[slot]), int(self._count[slot])
        starts = self._starts[offset : offset + count].tolist()
        ends = self._ends[offset : offset + count].tolist()
        owners = self._owners[offset : offset + count].tolist()
        first = bisect_right(ends, s)  # first span ending after the window starts
        after = bisect_left(starts, e)  # first span starting at or after its end
        busy = [(starts[i], ends[i]) for i in range(first, after) if owners[i] not in excluded]
        before = first - 1
        while before >= 0 and owners[before] in excluded:
            before -= 1
        following = after
        while following < count and owners[following] in excluded:
            following += 1
        near_before = before >= 0 and s - ends[before] <= lookaround
        near_after = following < count and starts[following] - e <= lookaround
        return _Around(
            busy, ends[before] if near_before else None, starts[following] if near_after else None
        )
