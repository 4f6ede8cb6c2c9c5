"""The bipartite matching of late binding's quick refusal, against a brute force."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from climate.planner.matching import can_match

HOSTS = range(7)
Want = tuple[int, frozenset[int]]


def brute_force(wants: list[Want], busy: frozenset[int]) -> bool:
    """Try every choice of k hosts for each want, one want after the other."""

    def place(i: int, taken: frozenset[int]) -> bool:
        if i == len(wants):
            return True
        k, options = wants[i]
        usable = sorted(options - busy - taken)
        return any(place(i + 1, taken | set(chosen)) for chosen in combinations(usable, k))

    return place(0, frozenset())


wants_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.frozensets(st.sampled_from(HOSTS))), max_size=5
)


@settings(max_examples=400, deadline=None)
@given(wants=wants_strategy, busy=st.frozensets(st.sampled_from(HOSTS), max_size=3))
def test_can_match_agrees_with_a_brute_force(wants: list[Want], busy: frozenset[int]) -> None:
    assert can_match(wants, busy) == brute_force(wants, busy)


def test_a_want_with_many_hosts_is_served_whatever_the_others_take() -> None:
    wide = frozenset(range(100))
    narrow = frozenset({0, 1})
    assert can_match([(50, wide), (2, narrow), (1, frozenset({0}))]) is False
    assert can_match([(50, wide), (2, narrow)], busy={5}) is True
    assert can_match([(97, wide), (2, narrow)], busy={5, 6}) is False


def test_busy_hosts_are_nobody_s() -> None:
    assert can_match([(1, frozenset({3}))], busy={3}) is False
    assert can_match([(1, frozenset({3, 4})), (1, frozenset({4}))], busy={2}) is True
