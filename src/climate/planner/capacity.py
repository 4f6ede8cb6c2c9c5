"""Packing amounts into a capacity over time (volume GB in a storage pool).

Reservations of one pool overlap freely; what must hold is that at every instant the amounts of
the reservations covering it sum to at most the pool's capacity. A new amount fits over
[start, end) if the peak of what is already there within that window leaves room for it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Use = tuple[dt.datetime, dt.datetime, int]
"""An amount held over [start, end)."""


def peak(uses: Iterable[Use], start: dt.datetime, end: dt.datetime) -> int:
    """The largest sum of amounts held at one instant of [start, end)."""
    changes: list[tuple[dt.datetime, int]] = []
    for s, e, amount in uses:
        s, e = max(s, start), min(e, end)
        if s < e:
            changes.append((s, amount))
            changes.append((e, -amount))
    # At equal instants the releases (negative) come first: touching spans do not add up.
    changes.sort()
    highest = level = 0
    for _, delta in changes:
        level += delta
        highest = max(highest, level)
    return highest


@dataclass(frozen=True)
class Pool:
    id: int
    name: str
    capacity: int
    uses: Sequence[Use]
    """What other reservations hold in it around the window."""


@dataclass(frozen=True)
class Fit:
    pool: Pool
    free: int
    """The most that was free for the whole window before this amount."""


def choose_pool(pools: Sequence[Pool], amount: int, start: dt.datetime, end: dt.datetime) -> Fit:
    """The pool (of at least one) where ``amount`` fits for the whole window and leaves the
    least room (best fit, ties by id); when none fits, the one with the most free room, whose
    ``free`` is then less than ``amount``."""
    fits = [Fit(p, p.capacity - peak(p.uses, start, end)) for p in pools]
    roomy = [f for f in fits if f.free >= amount]
    if roomy:
        return min(roomy, key=lambda f: (f.free, f.pool.id))
    return max(fits, key=lambda f: (f.free, -f.pool.id))
