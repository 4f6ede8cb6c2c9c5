"""The busiest instant of a window (planner/sweep.py) against counting at every instant."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.planner.sweep import most_held

span = st.tuples(st.integers(0, 20), st.integers(1, 6), st.integers(1, 3))


def held_at_busiest_instant(spans: list[tuple[int, int, int]], begin: int, finish: int) -> int:
    """Every span holds over [start, end): at an integer instant t, those with start <= t < end."""
    return max((sum(n for s, e, n in spans if s <= t < e) for t in range(begin, finish)), default=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(span, max_size=12), st.integers(0, 20), st.integers(1, 10))
def test_most_held_is_the_count_at_the_busiest_instant(
    raw: list[tuple[int, int, int]], begin: int, length: int
) -> None:
    spans = [(s, s + d, n) for s, d, n in raw]
    starts = np.array([s for s, _, _ in spans], dtype=np.float64)
    ends = np.array([e for _, e, _ in spans], dtype=np.float64)
    counts = np.array([n for _, _, n in spans], dtype=np.int64)
    finish = begin + length
    assert most_held(starts, ends, counts, begin, finish) == held_at_busiest_instant(
        spans, begin, finish
    )


def test_a_release_and_a_take_at_one_instant_do_not_add_up() -> None:
    starts, ends = np.array([0.0, 5.0]), np.array([5.0, 9.0])
    assert most_held(starts, ends, np.array([2, 2]), 0.0, 10.0) == 2
