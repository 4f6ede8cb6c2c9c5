"""Choosing whole hosts for a window.

Rule (documented in docs/planning.md): among the hosts that match the properties and are free for
the whole window, grant as many as are free up to ``max`` (at least ``min``, else refuse), keeping
hosts the reservation already holds first, then preferring the cheapest hosts by the price table
(where prices set hosts apart: a premium, a price factor), then the hosts whose free gap around
the window is tightest (best fit in time), so that long free stretches stay whole for later
requests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from climate.errors import Conflict, NotEnoughCapacity

# A gap we know nothing about (no allocation on that side within the look-around) scores as this.
OPEN_GAP = dt.timedelta(days=3650)
MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class HostCalendar:
    """What the planner needs to know of one matching host around the requested window."""

    host_id: int
    name: str
    busy: Sequence[tuple[dt.datetime, dt.datetime]] = ()
    """Allocations overlapping the window."""
    previous_end: dt.datetime | None = None
    """End of the latest allocation that ends at or before the window's start."""
    next_start: dt.datetime | None = None
    """Start of the earliest allocation that starts at or after the window's end."""

    @property
    def free(self) -> bool:
        return not self.busy

    def fit(self, start: dt.datetime, end: dt.datetime) -> dt.timedelta:
        """How much free time the window would leave around it on this host: less is tighter."""
        before = start - self.previous_end if self.previous_end else OPEN_GAP
        after = self.next_start - end if self.next_start else OPEN_GAP
        return before + after


@dataclass(frozen=True, eq=False)
class HostsView:
    """The matching hosts around one window, as parallel arrays: one entry per host.

    Iterating gives each host's ``HostCalendar``, built on demand: deciding needs only the
    arrays, so a view of thousands of hosts costs a few array operations, not thousands of
    objects.
    """

    ids: npt.NDArray[np.int64]
    names: Sequence[str]
    free: npt.NDArray[np.bool_]
    fit: npt.NDArray[np.int64]
    """On free hosts, ``HostCalendar.fit`` in microseconds."""
    released: npt.NDArray[np.float64]
    """On busy hosts, the end of their last allocation in the window (seconds since the epoch)."""
    detail: Callable[[int], HostCalendar]
    """The calendar of the host at a position."""
    price: npt.NDArray[np.float64] | None = None
    """Each host's price per hour, where prices set the hosts apart (None: all alike): the
    cheaper go first, before the tighter fit."""

    @classmethod
    def of(
        cls, calendars: Iterable[HostCalendar], start: dt.datetime, end: dt.datetime
    ) -> HostsView:
        listed = list(calendars)
        return cls(
            ids=np.array([c.host_id for c in listed], dtype=np.int64),
            names=[c.name for c in listed],
            free=np.array([c.free for c in listed], dtype=np.bool_),
            fit=np.array(
                [c.fit(start, end) // MICROSECOND if c.free else 0 for c in listed], dtype=np.int64
            ),
            released=np.array(
                [max(e for _, e in c.busy).timestamp() if c.busy else 0.0 for c in listed],
                dtype=np.float64,
            ),
            detail=listed.__getitem__,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[HostCalendar]:
        return (self.detail(k) for k in range(len(self.ids)))

    def busy(self) -> dict[int, Sequence[tuple[dt.datetime, dt.datetime]]]:
        """The allocations in the window of each busy host."""
        return {int(self.ids[k]): self.detail(k).busy for k in np.flatnonzero(~self.free).tolist()}

    def best_fit(self, count: int, skip: Iterable[int]) -> list[int]:
        """The ``count`` free hosts with the smallest (price, fit, id), leaving out positions
        ``skip``."""
        if count <= 0:
            return []
        free = self.free.copy()
        free[list(skip)] = False
        found = np.flatnonzero(free)
        if len(found) > count:
            # Only candidates that can make the cut are sorted (a view may hold thousands).
            if self.price is not None:
                prices = self.price[found]
                cut = np.partition(prices, count - 1)[count - 1]
                cheaper = found[prices < cut]
                priced_at_cut = self._tightest(found[prices == cut], count - len(cheaper))
                found = np.concatenate((cheaper, priced_at_cut))
            else:
                found = self._tightest(found, count)
        keys: list[npt.NDArray[Any]] = [self.ids[found], self.fit[found]]
        if self.price is not None:
            keys.append(self.price[found])
        order = np.lexsort(keys)[:count]
        return [int(h) for h in self.ids[found[order]]]

    def _tightest(self, found: npt.NDArray[np.intp], count: int) -> npt.NDArray[np.intp]:
        """The ``count`` positions of ``found`` with the smallest (fit, id), in no order."""
        if len(found) <= count:
            return found
        fits = self.fit[found]
        worst = np.partition(fits, count - 1)[count - 1]
        tied = found[fits == worst]
        tighter = found[fits < worst]
        need = count - len(tighter)
        lowest = np.argpartition(self.ids[tied], need - 1)[:need]  # ids are unique
        return np.concatenate((tighter, tied[lowest]))


def replacements(view: HostsView, count: int, unusable: Iterable[int]) -> list[int]:
    """Up to ``count`` hosts to stand in for failed ones over the view's window: free ones,
    none of ``unusable`` (hosts down or failed lately), tightest fit first (docs/healing.md)."""
    banned = set(unusable)
    skip = [k for k, h in enumerate(view.ids.tolist()) if h in banned]
    return view.best_fit(count, skip)


@dataclass(frozen=True)
class HostDemand:
    """``min``..``max`` hosts for [start, end), with hosts already held kept when possible."""

    start: dt.datetime
    end: dt.datetime
    min: int
    max: int
    held: frozenset[int] = field(default_factory=frozenset)
    must_keep: frozenset[int] = field(default_factory=frozenset)
    """Hosts that cannot move (the lease is active on them): all must stay free."""


def choose_hosts(demand: HostDemand, calendars: HostsView | Iterable[HostCalendar]) -> list[int]:
    """Pick the hosts for ``demand`` among the matching hosts (a view, or their calendars).

    :raises NotEnoughCapacity: with how many hosts match, how many are free and until when the
        others are busy.
    :raises Conflict: ``max`` is below the number of hosts an active lease cannot give back.
    """
    if len(demand.must_keep) > demand.max:
        raise Conflict(
            f"the lease is active on {len(demand.must_keep)} hosts; max cannot drop below "
            f"that ({demand.max} asked)"
        )
    view = (
        calendars
        if isinstance(calendars, HostsView)
        else HostsView.of(calendars, demand.start, demand.end)
    )
    mine = demand.held | demand.must_keep
    at = (
        {int(view.ids[k]): k for k in np.flatnonzero(np.isin(view.ids, list(mine))).tolist()}
        if mine
        else {}
    )
    blocked = sorted(h for h in demand.must_keep if h not in at or not view.free[at[h]])
    if blocked:
        names = ", ".join(view.names[at[h]] if h in at else str(h) for h in blocked)
        raise NotEnoughCapacity(
            f"the lease is active on host(s) {names}, which are not free (or no longer match) "
            f"for the whole window {_window(demand)}; active hosts cannot be moved"
        )
    free = int(np.count_nonzero(view.free))
    if free < demand.min:
        raise NotEnoughCapacity(_refusal(demand, view, free))
    kept = [h for h in at if view.free[at[h]]]
    price = view.price

    def cost(h: int) -> float:
        return 0.0 if price is None else float(price[at[h]])

    kept.sort(
        key=lambda h: (
            h not in demand.must_keep,
            h not in demand.held,
            cost(h),
            int(view.fit[at[h]]),
            h,
        )
    )
    chosen = kept[: demand.max]
    return chosen + view.best_fit(demand.max - len(chosen), at.values())


def _window(demand: HostDemand) -> str:
    return f"{demand.start.isoformat()} to {demand.end.isoformat()}"


def _refusal(demand: HostDemand, view: HostsView, free: int) -> str:
    wanted = f"{demand.min} host(s) requested"
    if not len(view):
        return (
            f"Not enough hosts available: {wanted}, but no reservable host matches the properties"
        )
    busy = len(view) - free
    message = (
        f"Not enough hosts available: {wanted}, {len(view)} match the properties, "
        f"{free} free for the whole window {_window(demand)}"
    )
    if busy:
        # The time from which min hosts could be free again, if nothing else is booked.
        releases = np.sort(view.released[~view.free])
        needed = demand.min - free
        if needed <= busy:
            released = dt.datetime.fromtimestamp(float(releases[needed - 1]), dt.UTC)
            message += (
                f"; {busy} busy in the window, enough would be released by {released.isoformat()}"
            )
    return message
