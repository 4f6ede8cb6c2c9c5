"""Reclaiming whole hosts for a best-effort lease by moving other projects' instances away.

A matching host that is busy in the lease's window [start, end) can be *freed* if the only
things on it in the window are movable instance allocations (the caller decides which are: of
other projects, not ``movable: false``, not being started by a manager). Freeing it moves each
of those allocations, from ``now`` (or its own start, if later) to its end, to one other host
(a *target*) that:

- is not a host being freed, nor a matching host that is free in the window (the lease counts
  on those: moving instances there would only trade one busy host for another),
- matches the moved reservation (its ``eligible`` hosts) and is not reserved whole at any
  instant of the moved part's window,
- has room for the moved instances at every instant of that window, besides what it holds and
  what other moves of this plan bring,
- keeps the reservation's affinity: with ``false`` the target holds no other instance of the
  reservation in that window; with ``true`` all its instances are on the moved allocation
  already (one host at a time), and move together.

Rule: the ``need`` cheapest hosts are freed, cheapest first (fewest allocations to move, then
fewest instances, then fewest vCPUs, then lowest id); each allocation goes to the target that
matches and leaves the least room (best fit, by vCPUs then memory then disk, then lowest id),
preferring hosts that are not themselves candidates for freeing. A host that received a move
is no longer freed, and a host whose allocations do not all find a target is passed over. The
search is greedy: it may miss a combination an exhaustive search would find; what it returns
always holds (tests/test_reclaim.py checks it against a brute-force checker).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from climate.errors import NotEnoughCapacity
from climate.planner.capacity import peak
from climate.planner.instances import RESOURCES, Size


@dataclass(frozen=True)
class Blocker:
    """A movable instance allocation on a host the lease could use: ``count`` instances of
    ``size`` each over [start, end)."""

    allocation_id: str
    reservation_id: str
    lease_id: str
    project_id: str
    host_id: int
    count: int
    size: Size
    start: dt.datetime
    end: dt.datetime
    affinity: bool | None
    eligible: frozenset[int]
    """Hosts the reservation may run on (matching, sized, reservable)."""


@dataclass(frozen=True)
class Candidate:
    """A matching host that is busy in the window."""

    id: int
    blockers: Sequence[Blocker]
    """Its movable instance allocations overlapping the window."""
    fixed: bool
    """Something that cannot move holds it in the window (a whole-host reservation, the lease's
    own project's instances, an unmovable or unlocked instance reservation)."""


@dataclass(frozen=True)
class TargetUse:
    """Instances of a reservation on a target over [start, end), ``used`` in all."""

    start: dt.datetime
    end: dt.datetime
    used: Size
    reservation_id: str


@dataclass(frozen=True)
class Target:
    """A host instances could move to: its (ratio-scaled) size, the windows in which it is
    reserved whole and the instances it holds, around the moved windows."""

    id: int
    capacity: Size
    whole: Sequence[tuple[dt.datetime, dt.datetime]] = ()
    uses: Sequence[TargetUse] = ()


@dataclass(frozen=True)
class ReclaimDemand:
    start: dt.datetime
    end: dt.datetime
    need: int
    """How many busy hosts must be freed."""
    now: dt.datetime
    """Instances move from here on; what ran before stays where it ran."""
    free: frozenset[int] = field(default_factory=frozenset)
    """Matching hosts already free in the window: never targets."""


@dataclass(frozen=True)
class Move:
    """One allocation's remaining part, [start, end), moved from one host to another."""

    blocker: Blocker
    to_host: int
    start: dt.datetime
    end: dt.datetime


@dataclass(frozen=True)
class Reclaim:
    freed: list[int]
    moves: list[Move]


def plan_reclaim(
    demand: ReclaimDemand, candidates: Sequence[Candidate], targets: Sequence[Target]
) -> Reclaim:
    """Which hosts to free and where their instances go (see the module doc for the rule).

    :raises NotEnoughCapacity: fewer than ``need`` hosts can be freed, with how many could.
    """
    freeable = [c for c in candidates if not c.fixed and c.blockers]
    freeable.sort(key=_cost)
    by_id = {t.id: t for t in targets}
    spoilable = frozenset(c.id for c in freeable)
    added: dict[int, list[TargetUse]] = {}
    freed: list[int] = []
    moves: list[Move] = []
    for candidate in freeable:
        if len(freed) == demand.need:
            break
        if candidate.id in added:
            continue  # it holds instances moved here by this plan
        barred = demand.free | set(freed) | {candidate.id}
        found = _place_all(candidate, demand.now, by_id, added, barred, spoilable)
        if found is None:
            continue
        freed.append(candidate.id)
        for move in found:
            added.setdefault(move.to_host, []).append(_use_of(move))
        moves.extend(found)
    if len(freed) < demand.need:
        raise NotEnoughCapacity(
            f"reclaim: {demand.need} more host(s) needed in the window "
            f"{demand.start.isoformat()} to {demand.end.isoformat()}; {len(freeable)} are held "
            f"only by movable instances of other projects, and {len(freed)} of them can be "
            "freed (no other host has room for the rest)"
        )
    return Reclaim(freed, moves)


def _cost(candidate: Candidate) -> tuple[int, int, int, int]:
    blockers = candidate.blockers
    return (
        len(blockers),
        sum(b.count for b in blockers),
        sum(b.size.vcpus * b.count for b in blockers),
        candidate.id,
    )


def _use_of(move: Move) -> TargetUse:
    b = move.blocker
    return TargetUse(move.start, move.end, b.size.times(b.count), b.reservation_id)


def _place_all(
    candidate: Candidate,
    now: dt.datetime,
    targets: Mapping[int, Target],
    added: Mapping[int, Sequence[TargetUse]],
    barred: set[int] | frozenset[int],
    spoilable: frozenset[int],
) -> list[Move] | None:
    """A target for every blocker of ``candidate`` (largest first), or None."""
    trial: dict[int, list[TargetUse]] = {h: list(uses) for h, uses in added.items()}
    moves: list[Move] = []
    ordered = sorted(
        candidate.blockers, key=lambda b: (-b.size.vcpus * b.count, b.start, b.allocation_id)
    )
    for blocker in ordered:
        start = max(now, blocker.start)
        best: tuple[tuple[bool, tuple[int, ...], int], int] | None = None
        for host in sorted(blocker.eligible - barred):
            target = targets.get(host)
            if target is None:
                continue
            spare = _spare(target, trial.get(host, ()), blocker, start)
            if spare is None:
                continue
            key = (host in spoilable, spare, host)
            if best is None or key < best[0]:
                best = (key, host)
        if best is None:
            return None
        move = Move(blocker, best[1], start, blocker.end)
        trial.setdefault(move.to_host, []).append(_use_of(move))
        moves.append(move)
    return moves


def _spare(
    target: Target, added: Sequence[TargetUse], blocker: Blocker, start: dt.datetime
) -> tuple[int, ...] | None:
    """What ``target`` has left after taking ``blocker`` over [start, blocker.end) at its
    fullest instant, per resource; None if it cannot take it."""
    end = blocker.end
    if any(s < end and e > start for s, e in target.whole):
        return None
    uses = [*target.uses, *added]
    if blocker.affinity is False and any(
        u.reservation_id == blocker.reservation_id and u.start < end and u.end > start for u in uses
    ):
        return None
    wanted = blocker.size.times(blocker.count).as_tuple()
    left = []
    for k, _ in enumerate(RESOURCES):
        held = peak(((u.start, u.end, u.used.as_tuple()[k]) for u in uses), start, end)
        room = target.capacity.as_tuple()[k] - held - wanted[k]
        if room < 0:
            return None
        left.append(room)
    return tuple(left)
