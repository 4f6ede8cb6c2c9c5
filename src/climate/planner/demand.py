"""Replaying refused demand: how many more hosts like a template would have admitted a share of
the requests refused over a period (docs/demand.md). Pure: no I/O.

The replay keeps every admitted allocation where it is, then takes the refused requests in the
order they were asked and admits each one if at least its ``min`` hosts it matches are free for
its whole window, among the real hosts and ``extra`` synthetic copies of the template host,
granting as many as are free up to its ``max`` (real hosts first, lowest position first, then
the copies). Time is cut at every start and end that occurs (coordinate compression), so the
replay is exact to the second, with half-open windows as admission has them.

Admission here is greedy, so one more host need not admit more requests (an earlier request
admitted thanks to it may take what a later one needed): ``least_extra`` therefore tries every
``extra`` from 0 up, never a bisection.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MOST_EXTRA = 1000
"""``least_extra`` looks no further than this many extra hosts."""


@dataclass(frozen=True)
class Wanted:
    """One refused request for whole hosts, as replayed."""

    start: float
    end: float
    """Seconds since the epoch, [start, end)."""
    min: int
    max: int
    hosts: frozenset[int]
    """The real hosts it matches."""
    extra: bool
    """Whether the template (so every synthetic copy of it) matches it."""


@dataclass(frozen=True)
class Replay:
    busy: Mapping[int, Sequence[tuple[float, float]]]
    """Each real host's admitted allocations, [start, end) in seconds; a host missing here is
    free throughout."""
    wanted: Sequence[Wanted]
    """The refused requests, in the order they were asked."""


@dataclass(frozen=True)
class Plan:
    extra: int | None
    """The fewest extra hosts with which at least ``needed`` requests are admitted; None: more
    than ``most``."""
    needed: int
    """Requests to admit: the target share of those the template matches, rounded up."""
    admitted: int
    """Of those, admitted with ``extra`` hosts (with the most tried if ``extra`` is None)."""
    admitted_without: int
    """Of those, admitted with no extra host (admitted allocations may have gone since)."""


@dataclass(frozen=True)
class _Prepared:
    """What every replay of ``Replay`` shares: the real hosts that matter (those some request
    matches), their admitted allocations as a busy matrix (host x span between the instants
    that cut time), and per request its span range and matched rows."""

    hosts: list[int]
    base: npt.NDArray[np.bool_]
    spans: list[tuple[int, int]]
    masks: list[npt.NDArray[np.bool_]]


def _prepare(replay: Replay) -> _Prepared:
    hosts = sorted(set().union(*(w.hosts for w in replay.wanted))) if replay.wanted else []
    instants = {p for w in replay.wanted for p in (w.start, w.end)}
    for host in hosts:
        for start, end in replay.busy.get(host, ()):
            instants.update((start, end))
    points = np.array(sorted(instants), dtype=np.float64)
    row = {host: i for i, host in enumerate(hosts)}
    base = np.zeros((len(hosts), max(0, len(points) - 1)), dtype=np.bool_)
    for host in hosts:
        for start, end in replay.busy.get(host, ()):
            first, last = np.searchsorted(points, (start, end))
            base[row[host], first:last] = True
    known: dict[frozenset[int], npt.NDArray[np.bool_]] = {}
    masks = []
    for w in replay.wanted:
        mask = known.get(w.hosts)
        if mask is None:
            mask = known[w.hosts] = np.zeros(len(hosts), dtype=np.bool_)
            mask[[row[h] for h in w.hosts]] = True
        masks.append(mask)
    spans = [
        (int(first), int(last))
        for first, last in (np.searchsorted(points, (w.start, w.end)) for w in replay.wanted)
    ]
    return _Prepared(hosts, base, spans, masks)


def cells(replay: Replay, extra: int) -> int:
    """How many booleans a replay with ``extra`` hosts holds (its memory, in bytes)."""
    hosts = set().union(*(w.hosts for w in replay.wanted)) if replay.wanted else set()
    instants = {p for w in replay.wanted for p in (w.start, w.end)}
    for host in hosts:
        for start, end in replay.busy.get(host, ()):
            instants.update((start, end))
    return (len(hosts) + extra) * max(0, len(instants) - 1)


def admitted(replay: Replay, extra: int) -> list[bool]:
    """Per refused request, in order, whether the replay with ``extra`` hosts admits it."""
    found = _admitted(replay, _prepare(replay), extra)
    assert found is not None  # without ``spare`` it runs to the end
    return found


def _admitted(
    replay: Replay, prepared: _Prepared, extra: int, spare: int | None = None
) -> list[bool] | None:
    """As ``admitted``; None as soon as more than ``spare`` counted requests (those the
    template matches) are refused: the target is then out of reach."""
    real = len(prepared.hosts)
    # Span x host: a window's rows are one contiguous block.
    taken = np.zeros((prepared.base.shape[1], real + extra), dtype=np.bool_)
    taken[:, :real] = prepared.base.T
    widened: dict[tuple[int, bool], npt.NDArray[np.bool_]] = {}
    found: list[bool] = []
    refused = 0
    for w, mask, (first, last) in zip(replay.wanted, prepared.masks, prepared.spans, strict=True):
        fits = False
        if last > first:
            key = (id(mask), w.extra)
            rows = widened.get(key)
            if rows is None:
                rows = widened[key] = np.concatenate([mask, np.full(extra, w.extra)])
            free = np.flatnonzero(rows & ~taken[first:last].any(axis=0))
            fits = len(free) >= w.min
            if fits:
                taken[first:last, free[: w.max]] = True
        found.append(bool(fits))
        refused += w.extra and not fits
        if spare is not None and refused > spare:
            return None
    return found


def least_extra(replay: Replay, percent: int, most: int = MOST_EXTRA) -> Plan:
    """The fewest extra hosts (0 to ``most``) with which at least ``percent`` % (by count) of
    the refused requests the template matches are admitted. Every refused request is replayed
    (the others compete for the real hosts), but only those are counted; a try stops as soon
    as too many of them are refused.

    Past the sum of their ``max`` nothing changes: each of them then fits on the copies alone
    and every grant is the same, so the search stops there."""
    counted = [w.extra for w in replay.wanted]
    needed = math.ceil(percent * sum(counted) / 100)
    prepared = _prepare(replay)
    without = _count(_admitted(replay, prepared, 0), counted)
    if without >= needed:
        return Plan(0, needed, without, without)
    last = min(most, sum(w.max for w in replay.wanted if w.extra))
    for extra in range(1, last + 1):
        found = _admitted(replay, prepared, extra, sum(counted) - needed)
        if found is not None:
            return Plan(extra, needed, _count(found, counted), without)
    return Plan(None, needed, _count(_admitted(replay, prepared, last), counted), without)


def _count(found: Sequence[bool] | None, counted: Sequence[bool]) -> int:
    assert found is not None  # a replay without ``spare`` runs to the end
    return sum(f and c for f, c in zip(found, counted, strict=True))
