"""The packed calendar's view and the host choice over it, against a brute-force reference.

The calendar (``climate.planner.calendar``) answers for all hosts at once with array operations,
and keeps each host's spans in a slab that moves and is compacted as it grows. Here random small
calendars are built span by span (or loaded in one pass), changed by dropping and re-adding
reservations, and every view is compared with one computed by filtering a plain list of spans:
which hosts are free, their neighbours and fit, their busy spans, and the hosts chosen.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.errors import Conflict, NotEnoughCapacity
from climate.planner import calendar as calendar_module
from climate.planner.calendar import Calendar, HostSet, Span, seconds
from climate.planner.hosts import HostCalendar, HostDemand, HostsView, choose_hosts

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
MICROSECOND = dt.timedelta(microseconds=1)
OWNERS = [f"r{i}" for i in range(6)]

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


def at(hours: float) -> dt.datetime:
    # Sub-second parts, so that fits are compared to the microsecond, not just to the hour.
    return T0 + dt.timedelta(hours=hours)


@dataclass(frozen=True)
class Busy:
    host_id: int
    start: dt.datetime
    end: dt.datetime
    owner: str

    def span(self) -> Span:
        return Span(self.host_id, seconds(self.start), seconds(self.end), self.owner)


@dataclass(frozen=True)
class Case:
    spans: tuple[Busy, ...]
    dropped: frozenset[str]
    """Reservations dropped after everything was added (the reference no longer has them)."""
    readded: frozenset[str]
    """Dropped reservations added back span by span, as a rollback does."""
    in_one_pass: bool
    viewed: tuple[int, ...]
    start: dt.datetime
    end: dt.datetime
    exclude: frozenset[str]
    lookaround: dt.timedelta
    min: int
    max: int
    held: frozenset[int]
    must_keep: frozenset[int]
    seed: int

    def calendar(self) -> Calendar:
        spans = list(self.spans)
        random.Random(self.seed).shuffle(spans)
        if self.in_one_pass:
            calendar = Calendar.of(s.span() for s in spans)
        else:
            calendar = Calendar()
            for s in spans:
                calendar.add(s.span())
        put_back = []
        for owner in sorted(self.dropped):
            spans = calendar.drop_owner(owner)
            if owner in self.readded:
                put_back += spans
        for span in put_back:
            calendar.add(span)
        return calendar

    def current(self) -> list[Busy]:
        gone = self.dropped - self.readded
        return [s for s in self.spans if s.owner not in gone]

    def pairs(self) -> list[tuple[int, str]]:
        return [(h, f"host-{h}") for h in self.viewed]

    def view(self, calendar: Calendar) -> HostsView:
        return calendar.view(
            HostSet(self.pairs()),
            self.start,
            self.end,
            self.exclude,
            self.lookaround.total_seconds(),
        )

    def demand(self) -> HostDemand:
        return HostDemand(self.start, self.end, self.min, self.max, self.held, self.must_keep)

    # -- the reference: filter a list ----------------------------------------------------------

    def expected(self) -> list[HostCalendar]:
        found = []
        for host_id, name in self.pairs():
            mine = [s for s in self.current() if s.host_id == host_id]
            seen = [s for s in mine if s.owner not in self.exclude]
            ended = [s.end for s in seen if s.end <= self.start]
            coming = [s.start for s in seen if s.start >= self.end]
            previous = max(ended, default=None)
            following = min(coming, default=None)
            found.append(
                HostCalendar(
                    host_id,
                    name,
                    tuple(
                        sorted(
                            (s.start, s.end)
                            for s in seen
                            if s.start < self.end and s.end > self.start
                        )
                    ),
                    previous if previous and self.start - previous <= self.lookaround else None,
                    following if following and following - self.end <= self.lookaround else None,
                )
            )
        return found

    def expected_choice(self) -> list[int] | None:
        """Best fit as the rule states it, or None for a refusal."""
        calendars = {c.host_id: c for c in self.expected()}
        if any(h not in calendars or not calendars[h].free for h in self.must_keep):
            return None
        free = [c for c in calendars.values() if c.free]
        if len(free) < self.min:
            return None
        free.sort(
            key=lambda c: (
                c.host_id not in self.must_keep,
                c.host_id not in self.held,
                c.fit(self.start, self.end),
                c.host_id,
            )
        )
        return [c.host_id for c in free[: self.max]]


# Strategies are built once: building them inside a draw costs more than the tests themselves.
HOST_IDS = st.integers(1, 12)
# Per host: (gap before, length, owner) in quarter hours; gaps of 0 make touching spans.
SLOTS = st.lists(
    st.tuples(st.integers(0, 16), st.integers(1, 24), st.sampled_from(OWNERS)), max_size=12
)
HOSTS = st.dictionaries(HOST_IDS, SLOTS, max_size=8)
OWNER_SETS = st.frozensets(st.sampled_from(OWNERS))
WEIGHTED = st.integers(0, 4).map(bool)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    hosts = draw(HOSTS)
    jitter = draw(st.integers(0, 999_999)) * MICROSECOND
    spans = []
    for host_id, slots in hosts.items():
        cursor = 0
        for gap, length, owner in slots:
            start = cursor + gap
            cursor = start + length
            spans.append(Busy(host_id, at(start / 4) + jitter, at(cursor / 4) + jitter, owner))
    # Mostly hosts with spans, some without any.
    viewed = [h for h in sorted(hosts) if draw(WEIGHTED)] + draw(st.lists(HOST_IDS, max_size=2))
    # Often on the spans' own grid, so that windows touch spans and gaps equal the look-around.
    offset = draw(st.sampled_from([jitter, draw(st.integers(0, 999_999)) * MICROSECOND]))
    start = at(draw(st.integers(0, 4 * 24)) / 4) + offset
    end = start + draw(st.integers(1, 4 * 12)) * HOUR / 4
    minimum = draw(st.integers(1, 3))
    maximum = minimum + draw(st.integers(0, 3))
    held = draw(st.frozensets(HOST_IDS, max_size=4))
    kept = draw(st.frozensets(st.sampled_from(sorted(held)))) if held else frozenset()
    return Case(
        spans=tuple(spans),
        dropped=draw(OWNER_SETS),
        readded=draw(OWNER_SETS),
        in_one_pass=draw(st.booleans()),
        viewed=tuple(dict.fromkeys(viewed)),
        start=start,
        end=end,
        exclude=draw(OWNER_SETS),
        lookaround=draw(st.integers(0, 4 * 12)) * HOUR / 4,
        min=minimum,
        max=maximum,
        held=held,
        must_keep=frozenset(sorted(kept)[:maximum]),
        seed=draw(st.integers(0, 2**16)),
    )


@pytest.mark.parametrize("counting", [True, False], ids=["counted", "searched"])
@PROPERTY_SETTINGS
@given(cases())
def test_view_matches_the_spans_filtered_one_by_one(counting: bool, case: Case) -> None:
    # Both ways of finding each host's spans before the window: counting over every slab at
    # once (small calendars, as these are) and the per-slab search (past ``COUNTING_MOST``).
    with mock.patch.object(calendar_module, "COUNTING_MOST", 1 << 62 if counting else 0):
        view = case.view(case.calendar())
    expected = case.expected()
    assert list(view) == expected
    assert view.free.tolist() == [c.free for c in expected]
    for k, c in enumerate(expected):
        if c.free:
            assert view.fit[k] == c.fit(case.start, case.end) // MICROSECOND
        else:
            assert view.released[k] == seconds(max(e for _, e in c.busy))


@PROPERTY_SETTINGS
@given(cases())
def test_choice_over_the_view_is_best_fit_or_a_refusal(case: Case) -> None:
    view = case.view(case.calendar())
    expected = case.expected_choice()
    if expected is None:
        with pytest.raises(NotEnoughCapacity) as fast:
            choose_hosts(case.demand(), view)
        # The same words as a decision over the hosts' calendars.
        with pytest.raises(NotEnoughCapacity) as slow:
            choose_hosts(case.demand(), case.expected())
        assert fast.value.message == slow.value.message
    else:
        assert choose_hosts(case.demand(), view) == expected


@PROPERTY_SETTINGS
@given(cases())
def test_overlapping_spans_are_those_of_the_host_in_the_window(case: Case) -> None:
    calendar = case.calendar()
    s, e = seconds(case.start), seconds(case.end)
    for host_id in {b.host_id for b in case.spans} | set(case.viewed):
        found = calendar.overlapping(host_id, s, e)
        assert sorted((x.start, x.end, x.owner) for x in found) == sorted(
            (x.start, x.end, x.owner)
            for x in (b.span() for b in case.current() if b.host_id == host_id)
            if x.start < e and x.end > s
        )


@PROPERTY_SETTINGS
@given(cases())
def test_taken_is_every_span_of_the_hosts_in_the_window_but_the_excluded(case: Case) -> None:
    s, e = seconds(case.start), seconds(case.end)
    starts, ends, owners = case.calendar().taken(HostSet(case.pairs()), s, e, case.exclude)
    expected = [
        b.span() for b in case.current() if b.host_id in case.viewed and b.owner not in case.exclude
    ]
    expected = [x for x in expected if x.start < e and x.end > s]
    assert sorted(zip(starts.tolist(), ends.tolist(), strict=True)) == sorted(
        (x.start, x.end) for x in expected
    )
    # One code per owner, different owners different codes.
    assert len(set(owners.tolist())) == len({x.owner for x in expected})


def _seen(case: Case, host_id: int) -> list[Span]:
    """The spans of a host but the excluded ones, as the reference has them."""
    return [
        b.span() for b in case.current() if b.host_id == host_id and b.owner not in case.exclude
    ]


def _free(case: Case, start: float, end: float) -> bool:
    return any(all(x.end <= start or end <= x.start for x in _seen(case, h)) for h in case.viewed)


@PROPERTY_SETTINGS
@given(cases(), st.lists(st.tuples(st.integers(0, 4 * 30), st.integers(1, 4 * 12)), max_size=6))
def test_free_somewhere_is_whether_some_host_has_no_span_in_each_window(
    case: Case, windows: list[tuple[int, int]]
) -> None:
    asked = [(seconds(case.start), seconds(case.end))] + [
        (seconds(at(s / 4)), seconds(at((s + n) / 4))) for s, n in windows
    ]
    starts = np.array([s for s, _ in asked], dtype=np.float64)
    ends = np.array([e for _, e in asked], dtype=np.float64)
    found = case.calendar().free_somewhere(HostSet(case.pairs()), starts, ends, case.exclude)
    assert found.tolist() == [_free(case, s, e) for s, e in asked]


@PROPERTY_SETTINGS
@given(cases(), st.integers(0, 3))
def test_straight_is_the_hosts_whose_spans_in_the_window_could_each_go_to_a_free_host(
    case: Case, most: int
) -> None:
    s, e = seconds(case.start), seconds(case.end)
    found = case.calendar().straight(HostSet(case.pairs()), s, e, most, case.exclude)
    expected = []
    for h in case.viewed:
        inside = [x for x in _seen(case, h) if x.start < e and s < x.end]
        if len(inside) <= most and all(_free(case, x.start, x.end) for x in inside):
            expected.append((len(inside), h))
    assert found.tolist() == [h for _, h in sorted(expected)]


def test_many_changes_on_few_hosts_keep_the_calendar_exact() -> None:
    # Slabs fill up and move many times over; some spans share a start, so dropping one must
    # find it by its owner.
    rng = random.Random(5)
    calendar = Calendar()
    spans: dict[str, list[Span]] = {}
    for n in range(3000):
        host, slot = rng.randrange(3), rng.randrange(500)
        owner = f"r{n}"
        spans[owner] = [Span(host, float(slot), slot + 1.0, owner)]
        calendar.add(spans[owner][0])
        if rng.random() < 0.4 and spans:
            victim = rng.choice(sorted(spans))
            assert calendar.drop_owner(victim) == spans.pop(victim)
    for host in range(3):
        expected = sorted(
            (s.start, s.end, s.owner) for held in spans.values() for s in held if s.host_id == host
        )
        got = [(s.start, s.end, s.owner) for s in calendar.overlapping(host, 0.0, 500.0)]
        assert sorted(got) == expected


def test_a_view_refuses_to_describe_a_calendar_changed_since() -> None:
    calendar = Calendar()
    calendar.add(Span(1, seconds(at(1)), seconds(at(2)), "r1"))
    view = calendar.view([(1, "one")], at(0), at(3))
    calendar.add(Span(1, seconds(at(5)), seconds(at(6)), "r2"))
    assert not view.free[0]  # the decision's arrays stay as they were
    with pytest.raises(RuntimeError, match="changed since"):
        list(view)


def test_must_keep_beyond_max_is_a_conflict_over_a_view() -> None:
    view = Calendar().view([(1, "one"), (2, "two")], at(0), at(1))
    with pytest.raises(Conflict):
        choose_hosts(HostDemand(at(0), at(1), 1, 1, frozenset({1, 2}), frozenset({1, 2})), view)


def test_a_host_set_viewed_again_sees_hosts_that_got_their_first_span() -> None:
    calendar = Calendar()
    hosts = HostSet([(1, "one"), (2, "two")])
    assert calendar.view(hosts, at(0), at(1)).free.tolist() == [True, True]
    calendar.add(Span(2, seconds(at(0)), seconds(at(1)), "r1"))
    assert calendar.view(hosts, at(0), at(1)).free.tolist() == [True, False]
    reloaded = Calendar.of([Span(1, seconds(at(0)), seconds(at(1)), "r2")])
    assert reloaded.view(hosts, at(0), at(1)).free.tolist() == [False, True]
