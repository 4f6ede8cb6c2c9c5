"""The power policy's decisions (docs/power.md), pure: which hosts to power down, which to wake,
and how many host-hours a set of powered-down periods saved."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PowerPlan:
    power_off: tuple[int, ...]
    """Hosts on with nothing allocated before ``now + idle``."""
    wake: tuple[int, ...]
    """Hosts powered down with an allocation starting before ``now + wake_ahead`` (or already
    under way)."""


def plan_power(
    on: Collection[int],
    off: Collection[int],
    next_busy: Mapping[int, dt.datetime],
    now: dt.datetime,
    idle: dt.timedelta,
    wake_ahead: dt.timedelta,
) -> PowerPlan:
    """``next_busy``: per host, when its earliest allocation still to end starts (a host absent
    has none). ``idle`` must exceed ``wake_ahead``, so that no host powered down here is one to
    wake at once (config.py checks it)."""
    return PowerPlan(
        power_off=tuple(sorted(h for h in on if h not in next_busy or next_busy[h] >= now + idle)),
        wake=tuple(sorted(h for h in off if h in next_busy and next_busy[h] < now + wake_ahead)),
    )


def hours_off(
    periods: Iterable[tuple[int, dt.datetime, dt.datetime | None]],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> dict[int, float]:
    """Per host, the hours of its powered-down periods (host, off, on; on None: still off at
    ``now``) that fall within [start, min(end, now))."""
    hours: dict[int, float] = {}
    until = min(end, now)
    for host_id, off_at, on_at in periods:
        low, high = max(off_at, start), min(on_at or now, until)
        if high > low:
            hours[host_id] = hours.get(host_id, 0.0) + (high - low).total_seconds() / 3600.0
    return hours
