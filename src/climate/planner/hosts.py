"""Choosing whole hosts for a window.

Rule (documented in docs/planning.md): among the hosts that match the properties and are free for
the whole window, grant as many as are free up to ``max`` (at least ``min``, else refuse), keeping
hosts the reservation already holds first, then preferring the hosts whose free gap around the
window is tightest (best fit in time), so that long free stretches stay whole for later requests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from climate.errors import Conflict, NotEnoughCapacity

# A gap we know nothing about (no allocation on that side within the look-around) scores as this.
OPEN_GAP = dt.timedelta(days=3650)


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


def choose_hosts(demand: HostDemand, calendars: Iterable[HostCalendar]) -> list[int]:
    """Pick the hosts for ``demand`` among the matching ``calendars``.

    :raises NotEnoughCapacity: with how many hosts match, how many are free and until when the
        others are busy.
    :raises Conflict: ``max`` is below the number of hosts an active lease cannot give back.
    """
    if len(demand.must_keep) > demand.max:
        raise Conflict(
            f"the lease is active on {len(demand.must_keep)} hosts; max cannot drop below "
            f"that ({demand.max} asked)"
        )
    hosts = list(calendars)
    by_id = {h.host_id: h for h in hosts}
    blocked = sorted(h for h in demand.must_keep if h not in by_id or not by_id[h].free)
    if blocked:
        names = ", ".join(by_id[h].name if h in by_id else str(h) for h in blocked)
        raise NotEnoughCapacity(
            f"the lease is active on host(s) {names}, which are not free (or no longer match) "
            f"for the whole window {_window(demand)}; active hosts cannot be moved"
        )
    free = [h for h in hosts if h.free]
    if len(free) < demand.min:
        raise NotEnoughCapacity(_refusal(demand, hosts, free))
    free.sort(
        key=lambda h: (
            h.host_id not in demand.must_keep,
            h.host_id not in demand.held,
            h.fit(demand.start, demand.end),
            h.host_id,
        )
    )
    return [h.host_id for h in free[: demand.max]]


def _window(demand: HostDemand) -> str:
    return f"{demand.start.isoformat()} to {demand.end.isoformat()}"


def _refusal(demand: HostDemand, hosts: list[HostCalendar], free: list[HostCalendar]) -> str:
    wanted = f"{demand.min} host(s) requested"
    if not hosts:
        return f"not enough hosts: {wanted}, but no reservable host matches the properties"
    busy = [h for h in hosts if not h.free]
    message = (
        f"not enough hosts: {wanted}, {len(hosts)} match the properties, "
        f"{len(free)} free for the whole window {_window(demand)}"
    )
    if busy:
        # The time from which min hosts could be free again, if nothing else is booked.
        releases = sorted(max(e for _, e in h.busy) for h in busy)
        needed = demand.min - len(free)
        if needed <= len(releases):
            message += (
                f"; {len(busy)} busy in the window, enough would be released by "
                f"{releases[needed - 1].isoformat()}"
            )
    return message
