"""What instance reservations use of each host over time, with their sizes, held in memory.

The whole-host calendar knows only when a host runs instances (one merged busy span per stretch
of use); placing instances needs each use's size. ``CalendarCache`` keeps these beside the
calendar, host by host, in step with it, so that admission, searches and timelines read them
here instead of querying ``instance_allocations`` (which grows with every lease).

Uses live in flat arrays; replacing a host's uses marks its old rows dead and appends the new
ones, and the arrays are compacted once dead rows outnumber live ones. A read is then one
vectorised pass over every live row, whatever the number of hosts asked about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from climate.planner.calendar import BoolArray, FloatArray, IntArray

_MIN_ROWS = 64


@dataclass(frozen=True, slots=True)
class HostUse:
    """One instance reservation's allocation on a host: [start, end) in seconds since the
    epoch, and the sizes of all its instances there."""

    host_id: int
    start: float
    end: float
    vcpus: int
    memory_mb: int
    disk_gb: int
    owner: str
    """The reservation's id."""


@dataclass(frozen=True)
class UsesWithin:
    """Uses overlapping a window, ordered by host position, then start."""

    position: IntArray
    """Each use's host, as its index in the host ids asked about."""
    starts: FloatArray
    ends: FloatArray
    sizes: IntArray
    """vcpus, memory_mb and disk_gb per use (shape (n, 3))."""


class InstanceUses:
    def __init__(self, uses: Iterable[HostUse] = ()) -> None:
        self._load(list(uses))

    def _load(self, uses: list[HostUse]) -> None:
        size = max(_MIN_ROWS, 2 * len(uses))
        self._rows: list[HostUse | None] = []
        self._of_host: dict[int, list[int]] = {}
        self._codes: dict[str, int] = {}
        self._dead = 0
        self._hosts: IntArray = np.zeros(size, dtype=np.int64)
        self._starts: FloatArray = np.zeros(size, dtype=np.float64)
        self._ends: FloatArray = np.zeros(size, dtype=np.float64)
        self._sizes: IntArray = np.zeros((size, 3), dtype=np.int64)
        self._owners: IntArray = np.zeros(size, dtype=np.int64)
        self._alive: BoolArray = np.zeros(size, dtype=np.bool_)
        self._append(uses)

    def of_host(self, host_id: int) -> list[HostUse]:
        return [u for r in self._of_host.get(host_id, ()) if (u := self._rows[r]) is not None]

    def replace_host(self, host_id: int, uses: Sequence[HostUse]) -> list[HostUse]:
        """Make ``uses`` all of ``host_id``'s; returns what it had (to put back on rollback)."""
        old = self.of_host(host_id)
        for row in self._of_host.pop(host_id, ()):
            self._rows[row] = None
            self._alive[row] = False
            self._dead += 1
        if self._dead > max(_MIN_ROWS, len(self._rows) - self._dead):
            self._load([u for u in self._rows if u is not None])
        self._append(uses)
        return old

    def _append(self, uses: Sequence[HostUse]) -> None:
        first, stop = len(self._rows), len(self._rows) + len(uses)
        if stop > len(self._alive):
            grown = 2 * stop
            self._hosts = np.resize(self._hosts, grown)
            self._starts = np.resize(self._starts, grown)
            self._ends = np.resize(self._ends, grown)
            self._sizes = np.resize(self._sizes, (grown, 3))
            self._owners = np.resize(self._owners, grown)
            self._alive = np.resize(self._alive, grown)
            self._alive[first:] = False
        for row, use in enumerate(uses, first):
            self._rows.append(use)
            self._of_host.setdefault(use.host_id, []).append(row)
            self._hosts[row] = use.host_id
            self._starts[row] = use.start
            self._ends[row] = use.end
            self._sizes[row] = (use.vcpus, use.memory_mb, use.disk_gb)
            self._owners[row] = self._codes.setdefault(use.owner, len(self._codes))
            self._alive[row] = True

    def within(
        self, host_ids: Sequence[int], start: float, end: float, other_than: str = ""
    ) -> UsesWithin:
        """The uses of ``host_ids`` overlapping [start, end), but those of ``other_than``."""
        n = len(self._rows)
        starts, ends = self._starts[:n], self._ends[:n]
        wanted = np.asarray(host_ids, dtype=np.int64)
        keep = self._alive[:n] & (starts < end) & (ends > start)
        keep &= np.isin(self._hosts[:n], wanted)
        code = self._codes.get(other_than) if other_than else None
        if code is not None:
            keep &= self._owners[:n] != code
        at = np.flatnonzero(keep)
        order = np.argsort(wanted, kind="stable")
        position = order[np.searchsorted(wanted, self._hosts[at], sorter=order)]
        by = np.lexsort((starts[at], position))
        at = at[by]
        return UsesWithin(position[by], starts[at], ends[at], self._sizes[at])
