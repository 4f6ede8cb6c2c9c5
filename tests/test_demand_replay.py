"""The demand replay (planner/demand.py) against a brute-force oracle: the same rule, written
the plain way (per-host lists of spans, every pair compared), and every k tried."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from climate.planner.demand import Replay, Wanted, admitted, least_extra

HOSTS = (1, 2, 3)


def oracle_admitted(replay: Replay, extra: int) -> list[bool]:
    spans: dict[object, list[tuple[float, float]]] = {
        h: list(replay.busy.get(h, ())) for h in HOSTS
    }
    copies = [("copy", i) for i in range(extra)]
    for c in copies:
        spans[c] = []
    found = []
    for w in replay.wanted:
        candidates: list[object] = sorted(w.hosts) + (copies if w.extra else [])
        free = [c for c in candidates if all(e <= w.start or s >= w.end for s, e in spans[c])]
        fits = len(free) >= w.min
        if fits:
            for c in free[: w.max]:
                spans[c].append((w.start, w.end))
        found.append(fits)
    return found


def oracle_least(replay: Replay, percent: int) -> int:
    counted = [w.extra for w in replay.wanted]
    needed = math.ceil(percent * sum(counted) / 100)
    k = 0
    while sum(a and c for a, c in zip(oracle_admitted(replay, k), counted, strict=True)) < needed:
        k += 1
    return k


times = st.integers(min_value=0, max_value=12).map(float)


@st.composite
def window(draw: st.DrawFn) -> tuple[float, float]:
    start = draw(times)
    return start, start + draw(st.integers(min_value=1, max_value=6))


@st.composite
def wanted(draw: st.DrawFn) -> Wanted:
    start, end = draw(window())
    low = draw(st.integers(min_value=1, max_value=3))
    return Wanted(
        start,
        end,
        low,
        low + draw(st.integers(min_value=0, max_value=2)),
        frozenset(draw(st.sets(st.sampled_from(HOSTS)))),
        draw(st.booleans()),
    )


@st.composite
def replays(draw: st.DrawFn) -> Replay:
    busy: dict[int, list[tuple[float, float]]] = {}
    for host in HOSTS:
        spans: list[tuple[float, float]] = []
        for start, end in draw(st.lists(window(), max_size=3)):
            if all(e <= start or s >= end for s, e in spans):
                spans.append((start, end))
        busy[host] = spans
    return Replay(busy, draw(st.lists(wanted(), max_size=6)))


@settings(max_examples=100, deadline=None)
@given(replays(), st.integers(min_value=0, max_value=4))
def test_the_replay_admits_what_the_oracle_admits(replay: Replay, extra: int) -> None:
    assert admitted(replay, extra) == oracle_admitted(replay, extra)


@settings(max_examples=100, deadline=None)
@given(replays(), st.integers(min_value=1, max_value=100))
def test_the_least_extra_is_the_oracles_least_k(replay: Replay, percent: int) -> None:
    plan = least_extra(replay, percent)
    assert plan.extra == oracle_least(replay, percent)
    counted = [w.extra for w in replay.wanted]

    def count(extra: int) -> int:
        return sum(a and c for a, c in zip(oracle_admitted(replay, extra), counted, strict=True))

    assert plan.needed == math.ceil(percent * sum(counted) / 100)
    assert (plan.admitted, plan.admitted_without) == (count(plan.extra), count(0))


def test_one_more_host_may_admit_fewer_so_every_k_is_tried() -> None:
    """No real host matches; A wants 2 hosts over [0, 10), then B and C one each over [0, 5)
    and [5, 10). One copy admits B and C; two admit A, which then takes both: one request."""
    replay = Replay(
        {1: [(0.0, 10.0)]},
        [
            Wanted(0.0, 10.0, 2, 2, frozenset(), True),
            Wanted(0.0, 5.0, 1, 1, frozenset(), True),
            Wanted(5.0, 10.0, 1, 1, frozenset(), True),
        ],
    )
    assert admitted(replay, 1) == [False, True, True]
    assert admitted(replay, 2) == [True, False, False]
    assert admitted(replay, 3) == [True, True, True]
    assert least_extra(replay, 60).extra == 1  # 2 of 3
    assert least_extra(replay, 100).extra == 3
