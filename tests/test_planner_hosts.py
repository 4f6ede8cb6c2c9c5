"""choose_hosts against a brute-force oracle over random calendars, plus its refusal messages.

Time is in whole hours from T0. A host's calendar is a few busy intervals [s, e); the oracle looks
at every hour of the window (free) and walks hour by hour away from it (fit), sharing no logic
with the planner.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.errors import NotEnoughCapacity
from climate.planner.hosts import OPEN_GAP, HostCalendar, HostDemand, HostsView, choose_hosts

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
HORIZON = 60  # every interval and window lies in [0, HORIZON) hours

PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)


def at(hours: int) -> dt.datetime:
    return T0 + hours * HOUR


@dataclass(frozen=True)
class Host:
    host_id: int
    busy: tuple[tuple[int, int], ...]

    def busy_at(self, hour: int) -> bool:
        return any(s <= hour < e for s, e in self.busy)

    def calendar(self, start: int, end: int) -> HostCalendar:
        """What db.hosts.calendars() reports for this host around [start, end)."""
        before = [e for s, e in self.busy if e <= start]
        after = [s for s, e in self.busy if s >= end]
        return HostCalendar(
            host_id=self.host_id,
            name=f"host-{self.host_id}",
            busy=tuple(sorted((at(s), at(e)) for s, e in self.busy if s < end and e > start)),
            previous_end=at(max(before)) if before else None,
            next_start=at(min(after)) if after else None,
        )


@dataclass(frozen=True)
class Case:
    hosts: tuple[Host, ...]
    start: int
    end: int
    min: int
    max: int
    held: frozenset[int]
    must_keep: frozenset[int]
    order_seed: int

    def demand(self) -> HostDemand:
        return HostDemand(
            start=at(self.start),
            end=at(self.end),
            min=self.min,
            max=self.max,
            held=self.held,
            must_keep=self.must_keep,
        )

    def calendars(self) -> list[HostCalendar]:
        calendars = [h.calendar(self.start, self.end) for h in self.hosts]
        random.Random(self.order_seed).shuffle(calendars)  # the planner must not rely on order
        return calendars

    # -- the oracle: brute force over hours --------------------------------------------------

    def free_ids(self) -> set[int]:
        return {
            h.host_id
            for h in self.hosts
            if not any(h.busy_at(t) for t in range(self.start, self.end))
        }

    def fit(self, host_id: int) -> dt.timedelta:
        """Free hours left before plus after the window on a free host (OPEN_GAP for no end)."""
        host = next(h for h in self.hosts if h.host_id == host_id)
        before = next(
            (self.start - t - 1 for t in range(self.start - 1, -1, -1) if host.busy_at(t)), None
        )
        after = next((t - self.end for t in range(self.end, HORIZON) if host.busy_at(t)), None)
        return (OPEN_GAP if before is None else before * HOUR) + (
            OPEN_GAP if after is None else after * HOUR
        )

    def rank(self, host_id: int) -> int:
        """0 for hosts that must be kept, 1 for other held hosts, 2 for the rest."""
        return 0 if host_id in self.must_keep else 1 if host_id in self.held else 2

    def should_refuse(self) -> bool:
        free = self.free_ids()
        return len(free) < self.min or not self.must_keep <= free


# Strategies are built once: building them inside a draw costs more than the tests themselves.
HOUR_IN_RANGE = st.integers(0, HORIZON - 13)
LENGTH = st.integers(1, 12)
INTERVALS = st.lists(st.tuples(HOUR_IN_RANGE, LENGTH), max_size=3)
# (host id, busy intervals as (start, length), held, must keep if held)
HOSTS = st.lists(
    st.tuples(st.integers(1, 30), INTERVALS, st.booleans(), st.booleans()),
    max_size=6,
    unique_by=lambda h: h[0],
)
DEMAND = st.tuples(HOUR_IN_RANGE, LENGTH, st.integers(1, 4), st.integers(0, 3))
SEED = st.integers(0, 2**16)


@st.composite
def cases(draw: st.DrawFn, keep: bool = True) -> Case:
    hosts = draw(HOSTS)
    start, length, minimum, extra = draw(DEMAND)
    maximum = minimum + extra
    held = frozenset(h for h, _, is_held, _ in hosts if is_held)
    # As when the lease is active: some of its hosts, never more than max (the resource type
    # refuses to lower max below the hosts an active lease holds).
    must_keep = (
        frozenset(sorted(h for h, _, is_held, kept in hosts if is_held and kept)[:maximum])
        if keep
        else frozenset()
    )
    return Case(
        tuple(Host(h, tuple((s, s + n) for s, n in busy)) for h, busy, _, _ in hosts),
        start,
        start + length,
        minimum,
        maximum,
        held,
        must_keep,
        draw(SEED),
    )


def run(case: Case) -> list[int] | None:
    """The chosen host ids, or None if the planner refused."""
    try:
        return choose_hosts(case.demand(), case.calendars())
    except NotEnoughCapacity:
        return None


# -- properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(cases(keep=False))
def test_refuses_iff_fewer_than_min_hosts_are_free(case: Case) -> None:
    assert (run(case) is None) is (len(case.free_ids()) < case.min)


@PROPERTY_SETTINGS
@given(cases())
def test_accepted_demand_gets_min_of_max_and_free_distinct_free_hosts(case: Case) -> None:
    chosen = run(case)
    if chosen is None:
        assert case.should_refuse()
        return
    free = case.free_ids()
    assert len(chosen) == len(set(chosen))
    assert set(chosen) <= free
    assert case.min <= len(chosen) <= case.max
    assert len(chosen) == min(case.max, len(free))


@PROPERTY_SETTINGS
@given(cases())
def test_must_keep_hosts_are_kept_when_free_else_refused(case: Case) -> None:
    chosen = run(case)
    if not case.must_keep <= case.free_ids():
        assert chosen is None
    elif chosen is not None:
        assert case.must_keep <= set(chosen)
    else:
        assert len(case.free_ids()) < case.min


@PROPERTY_SETTINGS
@given(cases())
def test_held_hosts_are_preferred_over_others(case: Case) -> None:
    chosen = run(case)
    if chosen is None:
        return
    free_held = case.free_ids() & case.held
    assert len(set(chosen) & case.held) == min(case.max, len(free_held))
    if any(h not in case.held for h in chosen):
        assert free_held <= set(chosen)


@PROPERTY_SETTINGS
@given(cases())
def test_no_unchosen_free_host_fits_tighter_than_a_chosen_one(case: Case) -> None:
    chosen = run(case)
    if chosen is None:
        return
    unchosen = case.free_ids() - set(chosen)
    for c in chosen:
        for u in unchosen:
            # A better class (must keep, then held) always wins; within a class, the tighter
            # fit, then the lower id.
            assert case.rank(c) <= case.rank(u)
            if case.rank(c) == case.rank(u):
                assert (case.fit(c), c) < (case.fit(u), u)


PRICES = st.lists(st.sampled_from([0.0, 1.5, 4.0]), min_size=30, max_size=30)


@PROPERTY_SETTINGS
@given(cases(), PRICES)
def test_with_prices_no_unchosen_free_host_is_cheaper_or_as_cheap_and_tighter(
    case: Case, prices: list[float]
) -> None:
    """Where prices set hosts apart, the cheaper host goes first, then the tighter fit."""
    view = HostsView.of(case.calendars(), at(case.start), at(case.end))
    priced = dataclasses.replace(
        view, price=np.array([prices[h - 1] for h in view.ids.tolist()], np.float64)
    )
    try:
        chosen = choose_hosts(case.demand(), priced)
    except NotEnoughCapacity:
        assert case.should_refuse()
        return
    assert not case.should_refuse()
    assert len(chosen) == min(case.max, len(case.free_ids()))
    unchosen = case.free_ids() - set(chosen)
    for c in chosen:
        for u in unchosen:
            assert case.rank(c) <= case.rank(u)
            if case.rank(c) == case.rank(u):
                mine, other = prices[c - 1], prices[u - 1]
                assert (mine, case.fit(c), c) < (other, case.fit(u), u)


VIEW_HOSTS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 4), st.sampled_from([0.0, 1.5, 4.0])),
    max_size=40,
)


@PROPERTY_SETTINGS
@given(VIEW_HOSTS, st.integers(1, 12), st.booleans(), SEED)
def test_best_fit_takes_the_smallest_price_fit_and_id_as_a_full_sort_would(
    hosts: list[tuple[bool, int, float]], count: int, priced: bool, seed: int
) -> None:
    ids = list(range(1, len(hosts) + 1))
    random.Random(seed).shuffle(ids)  # positions and ids in no common order
    view = HostsView(
        ids=np.array(ids, np.int64),
        names=[str(i) for i in ids],
        free=np.array([free for free, _, _ in hosts], np.bool_),
        fit=np.array([fit for _, fit, _ in hosts], np.int64),
        released=np.zeros(len(hosts)),
        detail=lambda k: calendar(ids[k]),
        price=np.array([price for _, _, price in hosts], np.float64) if priced else None,
    )
    ranked = sorted(
        (price if priced else 0.0, fit, host)
        for host, (free, fit, price) in zip(ids, hosts, strict=True)
        if free
    )
    assert view.best_fit(count, []) == [host for _, _, host in ranked[:count]]


@PROPERTY_SETTINGS
@given(cases(), SEED)
def test_choice_does_not_depend_on_calendar_order(case: Case, seed: int) -> None:
    calendars = case.calendars()
    shuffled = list(calendars)
    random.Random(seed).shuffle(shuffled)
    try:
        expected = choose_hosts(case.demand(), calendars)
    except NotEnoughCapacity:
        with pytest.raises(NotEnoughCapacity):
            choose_hosts(case.demand(), shuffled)
        return
    assert choose_hosts(case.demand(), shuffled) == expected


# -- examples --------------------------------------------------------------------------------


def demand(
    start: int, end: int, minimum: int, maximum: int | None = None, **kw: object
) -> HostDemand:
    return HostDemand(at(start), at(end), minimum, maximum or minimum, **kw)  # type: ignore[arg-type]


def calendar(
    host_id: int, *busy: tuple[int, int], before: int | None = None, after: int | None = None
) -> HostCalendar:
    return HostCalendar(
        host_id,
        f"compute-{host_id}",
        tuple((at(s), at(e)) for s, e in busy),
        previous_end=None if before is None else at(before),
        next_start=None if after is None else at(after),
    )


def refusal(d: HostDemand, calendars: list[HostCalendar]) -> str:
    with pytest.raises(NotEnoughCapacity) as caught:
        choose_hosts(d, calendars)
    assert caught.value.status == 409
    return caught.value.message


def test_refusal_counts_matching_and_free_hosts_and_says_when_enough_are_released() -> None:
    hosts = [calendar(1), calendar(2, (8, 13)), calendar(3, (11, 20)), calendar(4, (9, 11))]
    message = refusal(demand(10, 12, 3), hosts)
    assert "3 host(s) requested" in message
    assert "4 match the properties" in message
    assert f"1 free for the whole window {at(10).isoformat()} to {at(12).isoformat()}" in message
    assert "3 busy in the window" in message
    # Two more hosts are needed: host 4 is released at 11, host 2 at 13 (host 3 only at 20).
    assert message.endswith(f"enough would be released by {at(13).isoformat()}")


def test_refusal_release_time_is_the_last_busy_end_of_the_needed_host() -> None:
    message = refusal(demand(10, 12, 2), [calendar(1), calendar(2, (9, 11), (11, 15))])
    assert "1 free for the whole window" in message
    assert message.endswith(f"enough would be released by {at(15).isoformat()}")


def test_refusal_without_busy_hosts_says_too_few_match() -> None:
    message = refusal(demand(10, 12, 3), [calendar(1), calendar(2)])
    assert "3 host(s) requested, 2 match the properties, 2 free" in message
    assert "released" not in message


def test_refusal_with_no_matching_host_says_so() -> None:
    message = refusal(demand(10, 12, 1), [])
    assert message == (
        "Not enough hosts available: 1 host(s) requested, but no reservable host matches the "
        "properties"
    )


@pytest.mark.parametrize(
    ("must_keep", "calendars"),
    [
        (frozenset({2}), [calendar(1), calendar(2, (11, 14))]),  # busy in the new window
        (frozenset({2}), [calendar(1), calendar(3)]),  # no longer matches
    ],
    ids=["busy", "gone"],
)
def test_refusal_names_active_hosts_that_cannot_stay(
    must_keep: frozenset[int], calendars: list[HostCalendar]
) -> None:
    d = demand(10, 12, 1, 2, held=must_keep, must_keep=must_keep)
    message = refusal(d, calendars)
    assert "active on host(s)" in message
    assert "compute-2" in message or "host(s) 2," in message
    assert "active hosts cannot be moved" in message


def test_best_fit_prefers_the_tightest_gap_then_the_lowest_id() -> None:
    hosts = [
        calendar(1),  # open on both sides
        calendar(2, before=9, after=14),  # 1 + 2 hours
        calendar(3, before=10, after=20),  # 0 + 8 hours
        calendar(4, before=8, after=13),  # 2 + 1 hours, ties with 2
    ]
    assert choose_hosts(demand(10, 12, 1, 1), hosts) == [2]
    assert choose_hosts(demand(10, 12, 1, 3), hosts) == [2, 4, 3]


def test_a_cheaper_host_goes_before_a_tighter_fit_and_equal_prices_fall_back_to_the_fit() -> None:
    hosts = [
        calendar(1, before=10, after=12),  # the tightest fit, premium
        calendar(2),  # open on both sides
        calendar(3, before=9, after=14),
    ]
    view = HostsView.of(hosts, at(10), at(12))
    priced = dataclasses.replace(view, price=np.array([4.0, 1.5, 1.5]))
    assert choose_hosts(demand(10, 12, 1, 1), view) == [1]
    assert choose_hosts(demand(10, 12, 1, 1), priced) == [3]
    assert choose_hosts(demand(10, 12, 1, 3), priced) == [3, 2, 1]


def test_held_hosts_are_kept_even_with_a_looser_fit() -> None:
    hosts = [calendar(1), calendar(2, before=10, after=12)]
    assert choose_hosts(demand(10, 12, 1, held=frozenset({1})), hosts) == [1]


def test_active_hosts_beyond_max_are_a_conflict_not_a_silent_drop() -> None:
    from climate.errors import Conflict

    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    demand = HostDemand(
        start=start,
        end=start + dt.timedelta(hours=1),
        min=1,
        max=1,
        held=frozenset({1, 2}),
        must_keep=frozenset({1, 2}),
    )
    calendars = [HostCalendar(1, "a"), HostCalendar(2, "b")]
    with pytest.raises(Conflict, match="max cannot drop below"):
        choose_hosts(demand, calendars)
