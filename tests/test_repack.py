"""Re-optimisation of pending leases (planner/repack.py) against a brute-force oracle.

Time is in whole hours from T0. A case is a few hosts, a few reservations already placed without
double booking (some pending, some started or not pending, some with a cut-short allocation), a
clock, and a new demand. The oracle enumerates every reassignment of the movable reservations
(pending, not started, one window: each may end on any ``k`` hosts among those it matches and
those it holds) and every choice of hosts for the demand, keeps the ones without double booking,
and returns the fewest units (one host of one reservation) moved. It shares no logic with the
planner's search (eviction chains, pinning, deepening).

Then, through the service layer on SQLite and PostgreSQL: a request refused without moves is
admitted by moving a pending lease to an equivalent host, and a started lease is never moved.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from climate.config import Settings
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Event, HostAllocation, Lease
from climate.domain.clock import ManualClock
from climate.domain.status import EventStatus, EventType, LeaseStatus
from climate.errors import NotEnoughCapacity
from climate.planner.calendar import Calendar, HostSet, Span
from climate.planner.repack import (
    BUDGET,
    MAX_MOVES,
    UNTIMED,
    WIDE,
    Holder,
    Occupant,
    Repack,
    RepackDemand,
    _deepening,
    plan,
)
from climate.resources.hosts import PhysicalHostType
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request, hosts_of

HOUR = dt.timedelta(hours=1)
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)
UNBOUNDED = {"budget": 10**7, "max_moves": 64}  # for the oracle test: nothing cut short


def at(hours: int) -> dt.datetime:
    return T0 + hours * HOUR


@dataclass(frozen=True)
class Res:
    id: str
    windows: tuple[tuple[int, int, int], ...]  # (host, start, end): one per host held
    eligible: frozenset[int]
    pending: bool

    @property
    def hosts(self) -> frozenset[int]:
        return frozenset(h for h, _, _ in self.windows)

    @property
    def uniform(self) -> bool:
        return len({(s, e) for _, s, e in self.windows}) == 1

    def movable(self, now: int) -> bool:
        start = self.windows[0][1]
        return self.pending and self.uniform and start > now


@dataclass(frozen=True)
class Case:
    hosts: tuple[int, ...]
    reservations: tuple[Res, ...]
    now: int
    start: int
    end: int
    count: int
    candidates: frozenset[int]
    required: frozenset[int]

    def demand(self) -> RepackDemand:
        return RepackDemand(
            at(self.start), at(self.end), self.count, self.candidates, self.required
        )

    # -- the planner's World: this case's calendar -----------------------------------------------

    def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> list[Occupant]:
        return [
            (at(s), at(e), r.id)
            for r in self.reservations
            for h, s, e in r.windows
            if h == host and at(s) < end and start < at(e)
        ]

    def counts(
        self, hosts: Collection[int], start: dt.datetime, end: dt.datetime
    ) -> dict[int, int]:
        return {h: len(self.occupants(h, start, end)) for h in hosts}

    def holders(self, ids: Iterable[str]) -> dict[str, Holder]:
        wanted = set(ids)
        return {
            r.id: Holder(
                id=r.id,
                lease_id=f"lease-{r.id}",
                start=at(r.windows[0][1]),
                end=at(r.windows[0][2]),
                hosts=r.hosts,
                eligible=r.eligible,
                pending=r.pending,
                uniform=r.uniform,
            )
            for r in self.reservations
            if r.id in wanted
        }

    def plan(self, budget: int = BUDGET, max_moves: int = MAX_MOVES) -> Repack | None:
        return plan(self.demand(), at(self.now), self, budget=budget, max_moves=max_moves)

    def plan_as_the_service(self) -> Repack | None:
        """As admission calls it: with the candidates' busy spans from the calendar view, and
        ``closed`` when every host is a candidate."""
        spans = [
            o for h in self.candidates for o in self.occupants(h, at(self.start), at(self.end))
        ]
        codes = {rid: code for code, rid in enumerate(sorted({o[2] for o in spans}))}
        busy = (
            np.array([s.timestamp() for s, _, _ in spans], dtype=np.float64),
            np.array([e.timestamp() for _, e, _ in spans], dtype=np.float64),
            np.array([codes[rid] for _, _, rid in spans], dtype=np.int64),
        )
        demand = replace(self.demand(), closed=self.candidates == set(self.hosts))
        calendar = Calendar.of(
            Span(h, at(s).timestamp(), at(e).timestamp(), r.id)
            for r in self.reservations
            for h, s, e in r.windows
        )
        matching = HostSet((h, "") for h in sorted(self.candidates))

        def straight(most: int) -> list[int]:
            s, e = at(self.start).timestamp(), at(self.end).timestamp()
            found: list[int] = calendar.straight(matching, s, e, most).tolist()
            return found

        return plan(demand, at(self.now), self, busy=busy, straight=straight)

    # -- the oracle ------------------------------------------------------------------------------

    def oracle(self) -> int | None:
        """Fewest units moved over every valid reassignment, or None if there is none."""
        fixed = [
            (h, s, e) for r in self.reservations if not r.movable(self.now) for h, s, e in r.windows
        ]
        movable = [r for r in self.reservations if r.movable(self.now)]
        demand_sets = [
            set(c)
            for c in itertools.combinations(sorted(self.candidates), self.count)
            if self.required <= set(c)
        ]
        best: int | None = None

        def clash(taken: list[tuple[int, int, int]], hosts: Iterable[int], s: int, e: int) -> bool:
            return any(h == th and s < te and ts < e for h in hosts for th, ts, te in taken)

        def walk(i: int, taken: list[tuple[int, int, int]], moved: int) -> None:
            nonlocal best
            if best is not None and moved >= best:
                return
            if i == len(movable):
                best = moved
                return
            r = movable[i]
            _, s, e = r.windows[0]
            k = len(r.windows)
            for chosen in itertools.combinations(sorted(r.eligible | r.hosts), k):
                if clash(taken, chosen, s, e):
                    continue
                walk(i + 1, taken + [(h, s, e) for h in chosen], moved + len(set(chosen) - r.hosts))

        for chosen in demand_sets:
            if not clash(fixed, chosen, self.start, self.end):
                walk(0, fixed + [(h, self.start, self.end) for h in chosen], 0)
        return best


@st.composite
def cases(draw: st.DrawFn) -> Case:
    hosts = tuple(range(1, draw(st.integers(3, 5)) + 1))
    demand_start = draw(st.integers(1, 8))
    demand_end = demand_start + draw(st.integers(1, 4))
    taken: list[tuple[int, int, int]] = []
    reservations: list[Res] = []
    for i in range(draw(st.integers(2, 6))):
        # Most reservations around the demand's window, where they get in its way.
        start = draw(st.integers(max(1, demand_start - 4), demand_end) | st.integers(1, 12))
        end = start + draw(st.integers(1, 5))
        k = draw(st.integers(1, 2))
        free = [
            h for h in hosts if not any(th == h and start < te and ts < end for th, ts, te in taken)
        ]
        if len(free) < k:
            continue
        chosen = draw(st.permutations(free))[:k]
        # Mostly the hosts held match; sometimes one no longer does (its properties changed).
        eligible = set(draw(st.sets(st.sampled_from(hosts), min_size=len(hosts) - 2)))
        if draw(st.integers(0, 4)):
            eligible |= set(chosen)
        windows = [(h, start, end) for h in chosen]
        if k == 2 and end - start >= 2 and not draw(st.integers(0, 9)):
            windows[1] = (chosen[1], start, end - 1)  # cut short: fixed
        taken.extend(windows)
        reservations.append(
            Res(f"r{i}", tuple(windows), frozenset(eligible), draw(st.integers(0, 4)) > 0)
        )
    # Often only hosts that pending reservations hold in the window: nothing fits without moves.
    in_the_way = sorted(
        {
            h
            for r in reservations
            if r.pending
            for h, s, e in r.windows
            if s < demand_end and demand_start < e
        }
    )
    narrow: bool = draw(st.booleans())
    pool = in_the_way if in_the_way and narrow else list(hosts)
    candidates = frozenset(draw(st.sets(st.sampled_from(pool), min_size=1, max_size=3)))
    count = draw(st.integers(1, min(2, len(candidates))))
    required = frozenset(
        draw(st.sets(st.sampled_from(sorted(candidates)), max_size=count))
        if not draw(st.integers(0, 3))
        else ()
    )
    return Case(
        hosts=hosts,
        reservations=tuple(reservations),
        now=draw(st.integers(0, 2)),
        start=demand_start,
        end=demand_end,
        count=count,
        candidates=candidates,
        required=required,
    )


def check_valid(case: Case, found: Repack) -> int:
    """Every promise kept and no double booking once the moves are made; units moved."""
    by_id = {r.id: r for r in case.reservations}
    rows = {(h, r.id): (s, e) for r in case.reservations for h, s, e in r.windows}
    moved_units = 0
    for move in found.moves:
        r = by_id[move.reservation_id]
        assert r.movable(case.now), f"{r.id} is started, not pending or cut short: cannot move"
        _, s, e = r.windows[0]
        assert (move.start, move.end) == (at(s), at(e)), "the window of a moved reservation changed"
        assert move.removed <= r.hosts and not move.added & r.hosts
        assert move.kept == r.hosts - move.removed
        assert len(move.added) == len(move.removed), "the host count of a reservation changed"
        assert move.added <= r.eligible, "moved to a host that does not match"
        assert move.lease_id == f"lease-{r.id}"
        for h in move.removed:
            del rows[(h, r.id)]
        for h in move.added:
            rows[(h, r.id)] = (s, e)
        moved_units += len(move.added)
    assert len(found.hosts) == case.count
    assert case.required <= found.hosts <= case.candidates
    for h in found.hosts:
        rows[(h, "new")] = (case.start, case.end)
    by_host: dict[int, list[tuple[int, int]]] = {}
    for (host, _), window in rows.items():
        by_host.setdefault(host, []).append(window)
    for host, windows in by_host.items():
        windows.sort()
        for (_, e1), (s2, _) in itertools.pairwise(windows):
            assert e1 <= s2, f"host {host} booked twice"
    return moved_units


@PROPERTY_SETTINGS
@given(cases())
def test_repack_matches_brute_force(case: Case) -> None:
    """Admits iff some reassignment exists; valid; moves as few units as the oracle (up to the
    deepening step)."""
    best = case.oracle()
    found = case.plan(**UNBOUNDED)
    if best is None:
        assert found is None
        return
    assert found is not None, f"the oracle moves {best} unit(s) to admit it"
    moved = check_valid(case, found)
    assert moved <= min(m for m in _deepening(64) if m >= best)
    if best <= 4:  # the deepening steps one by one up to 4
        assert moved == best


@PROPERTY_SETTINGS
@given(cases())
def test_repack_with_the_service_bounds(case: Case) -> None:
    """With the service's bounds, on cases this small: the same answers (within MAX_MOVES)."""
    best = case.oracle()
    found = case.plan_as_the_service()
    if best is None or best > MAX_MOVES:
        assert found is None or check_valid(case, found) <= MAX_MOVES
        return
    assert found is not None, f"the oracle moves {best} unit(s) to admit it"
    check_valid(case, found)


# -- examples --------------------------------------------------------------------------------------


def example(
    reservations: list[Res],
    now: int,
    start: int,
    end: int,
    count: int,
    candidates: set[int],
    required: frozenset[int] = frozenset(),
) -> Case:
    return Case(
        (1, 2, 3), tuple(reservations), now, start, end, count, frozenset(candidates), required
    )


def test_moves_a_pending_reservation_to_free_the_only_candidate() -> None:
    a = Res("a", ((1, 2, 6),), frozenset({1, 2}), pending=True)
    b = Res("b", ((2, 8, 12),), frozenset({2}), pending=True)
    case = example([a, b], now=0, start=4, end=10, count=1, candidates={1})
    found = case.plan()
    assert found is not None
    assert [(m.reservation_id, m.removed, m.added) for m in found.moves] == [
        ("a", frozenset({1}), frozenset({2}))
    ]
    assert found.hosts == {1}


def test_chain_of_moves() -> None:
    """a must leave host 1; it only fits on 2 once b moves on to 3."""
    a = Res("a", ((1, 0 + 2, 6),), frozenset({1, 2}), pending=True)
    b = Res("b", ((2, 3, 5),), frozenset({2, 3}), pending=True)
    c = Res("c", ((3, 8, 9),), frozenset({3}), pending=True)
    case = example([a, b, c], now=0, start=4, end=10, count=1, candidates={1})
    found = case.plan()
    assert found is not None
    assert {(m.reservation_id, min(m.added)) for m in found.moves} == {("a", 2), ("b", 3)}


@pytest.mark.parametrize(
    ("pending", "now"),
    [(False, 0), (True, 2), (True, 3)],
    ids=["not-pending", "starts-now", "started"],
)
def test_never_moves_a_started_or_not_pending_reservation(pending: bool, now: int) -> None:
    a = Res("a", ((1, 2, 6),), frozenset({1, 2}), pending=pending)
    case = example([a], now=now, start=4, end=10, count=1, candidates={1})
    assert case.oracle() is None
    assert case.plan() is None


def test_frees_a_required_host() -> None:
    """An active lease extended on host 1 keeps it: a pending lease booked after it moves."""
    a = Res("a", ((1, 6, 9),), frozenset({1, 2}), pending=True)
    case = example([a], now=0, start=0, end=8, count=1, candidates={1, 2}, required=frozenset({1}))
    found = case.plan()
    assert found is not None and found.hosts == {1}
    assert [m.reservation_id for m in found.moves] == ["a"]


def test_plain_lack_of_capacity_is_refused_without_reading_reservations() -> None:
    """Every host busy at hour 4 and no filter: refused by counting, before any search."""
    busy = [Res(f"r{h}", ((h, 3, 5),), frozenset({1, 2, 3}), pending=True) for h in (1, 2, 3)]
    case = example(busy, now=0, start=4, end=6, count=1, candidates={1, 2, 3})
    asked: list[Iterable[str]] = []

    class Counting:
        def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> list[Occupant]:
            return case.occupants(host, start, end)

        def holders(self, ids: Iterable[str]) -> dict[str, Holder]:
            asked.append(ids)
            return case.holders(ids)

        def counts(
            self, hosts: Collection[int], start: dt.datetime, end: dt.datetime
        ) -> dict[int, int]:
            return case.counts(hosts, start, end)

    closed = replace(case.demand(), closed=True)
    assert plan(closed, at(0), Counting()) is None
    assert asked == []
    assert plan(case.demand(), at(0), Counting()) is None  # not closed: reads them, same answer


def test_wide_choice_finds_a_move_among_many_hosts() -> None:
    """More than WIDE hosts: examined lazily, fewest allocations first; still finds the move."""
    hosts = tuple(range(1, WIDE + 40))
    every = frozenset(hosts)
    # Host 1 is the only candidate; a pending reservation holds it and may go anywhere; all
    # other hosts but the last are busy with fixed (started) reservations.
    blocker = Res("a", ((1, 4, 8),), every, pending=True)
    fixed = [Res(f"f{h}", ((h, 0, 20),), every, pending=True) for h in hosts[1:-1]]
    case = Case(
        hosts,
        (blocker, *fixed),
        now=1,
        start=5,
        end=7,
        count=1,
        candidates=frozenset({1}),
        required=frozenset(),
    )
    found = case.plan()
    assert found is not None
    assert [(m.reservation_id, m.added) for m in found.moves] == [("a", frozenset({hosts[-1]}))]
    check_valid(case, found)


def _one_host_moves_straight(hosts: int) -> Case:
    """Every host but the last two is taken over [9 h, 21 h) by a pending reservation that can
    go nowhere else; host ``hosts - 1`` holds b over [15 h, 30 h) and the last host c over
    [8 h, 14 h): either can move to the other's host. A one-host demand over [10 h, 20 h)."""
    every = frozenset(range(1, hosts + 1))
    stuck = [Res(f"x{h}", ((h, 9, 21),), every, pending=True) for h in range(1, hosts - 1)]
    b = Res("b", ((hosts - 1, 15, 30),), every, pending=True)
    c = Res("c", ((hosts, 8, 14),), every, pending=True)
    return Case(tuple(sorted(every)), (*stuck, b, c), 0, 10, 20, 1, every, frozenset())


@pytest.mark.parametrize("as_the_service", [False, True])
def test_units_that_move_straight_to_a_free_host_are_found_among_many(
    as_the_service: bool,
) -> None:
    """The reservations in the way on the first hosts cannot move; the search would spend its
    whole budget on them before reaching b or c, the direct step finds one."""
    case = _one_host_moves_straight(120)
    found = case.plan_as_the_service() if as_the_service else case.plan()
    assert found is not None
    assert check_valid(case, found) == 1
    assert {m.reservation_id for m in found.moves} <= {"b", "c"}


def _a_chain_in_a_wide_pool(hosts: int) -> Case:
    """Every host a candidate for a one-host demand over [10 h, 20 h), all but three busy
    throughout with reservations that are not pending. x on host 1 is in the way and fits no
    free host; it fits host 2 once y moves to host 3, which is free before z: two moves."""
    every = frozenset(range(1, hosts + 1))
    fixed = [Res(f"f{h}", ((h, 0, 40),), every, pending=False) for h in range(4, hosts + 1)]
    x = Res("x", ((1, 5, 15),), every, pending=True)
    y = Res("y", ((2, 4, 8),), every, pending=True)
    w = Res("w", ((2, 19, 30),), every, pending=False)
    z = Res("z", ((3, 9, 40),), every, pending=False)
    return Case(tuple(sorted(every)), (*fixed, x, y, w, z), 0, 10, 20, 1, every, frozenset())


def test_a_closed_wide_one_host_request_stops_after_the_direct_step() -> None:
    """Every host a candidate and more than WIDE of them: when no unit moves straight to a
    free host, the request is refused without the search, which here would find the chain."""
    case = _a_chain_in_a_wide_pool(WIDE + 16)
    found = case.plan()
    assert found is not None and check_valid(case, found) == 2
    assert case.plan_as_the_service() is None
    assert plan(replace(case.demand(), closed=True), at(case.now), case) is None


def _the_last_host_is_free(hosts: tuple[int, ...]) -> Case:
    """Host 1 is the only candidate; a pending reservation on it may go anywhere; every other
    host but the last is busy with a reservation that is not pending."""
    every = frozenset(hosts)
    blocker = Res("a", ((1, 4, 8),), every, pending=True)
    fixed = [Res(f"f{h}", ((h, 0, 20),), every, pending=False) for h in hosts[1:-1]]
    return Case(hosts, (blocker, *fixed), 1, 5, 7, 1, frozenset({1}), frozenset())


def _a_chain_past_busy_hosts(hosts: tuple[int, ...]) -> Case:
    """Host 1 is the only candidate; a pending reservation a on it may go anywhere, but every
    other host is busy in its window: the last but one with b, which may move to the last host
    (busy only before b starts), all others with reservations that are not pending. No unit
    moves straight to a free host: a must push b."""
    every = frozenset(hosts)
    a = Res("a", ((1, 4, 8),), every, pending=True)
    fixed = [Res(f"f{h}", ((h, 0, 20),), every, pending=False) for h in hosts[1:-2]]
    b = Res("b", ((hosts[-2], 6, 12),), every, pending=True)
    early = Res("early", ((hosts[-1], 0, 5),), every, pending=False)
    return Case(hosts, (a, *fixed, b, early), 1, 5, 7, 1, frozenset({1}), frozenset())


def test_a_search_past_its_untimed_steps_stops_at_the_deadline() -> None:
    case = _a_chain_past_busy_hosts(tuple(range(1, 401)))
    found = case.plan()
    assert found is not None and found.steps > UNTIMED
    gone = time.monotonic() - 1
    assert plan(case.demand(), at(case.now), case, deadline=gone) is None


def test_a_small_search_is_never_cut_by_the_deadline() -> None:
    case = _the_last_host_is_free(tuple(range(1, 9)))
    gone = time.monotonic() - 1
    found = plan(case.demand(), at(case.now), case, deadline=gone)
    assert found is not None and found.steps <= UNTIMED
    assert [(m.reservation_id, m.added) for m in found.moves] == [("a", frozenset({8}))]


# -- through the service, on SQLite and PostgreSQL ---------------------------------------------


def zone_hosts(hosts: HostService) -> tuple[int, int]:
    one = hosts.create(ADMIN, "compute-z1", {"zone": "z1"}).id
    two = hosts.create(ADMIN, "compute-z2", {"zone": "z2"}).id
    return one, two


def layout(leases: LeaseService, start_a: dt.datetime) -> tuple[str, str]:
    """a (any host) on host 1, b (zone z2 only) on host 2; each host has a gap the other lacks."""
    a = leases.create(ALICE, host_request("a", start_a, T0 + 6 * HOUR))
    b = leases.create(
        BOB,
        host_request(
            "b", T0 + 8 * HOUR, T0 + 12 * HOUR, resource_properties='["==", "$zone", "z2"]'
        ),
    )
    return a.id, b.id


def test_service_admits_by_moving_a_pending_lease(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    one, two = zone_hosts(hosts)
    a_id, b_id = layout(leases, T0 + 2 * HOUR)
    assert hosts_of(leases.get(ADMIN, a_id)) == {one}
    assert hosts_of(leases.get(ADMIN, b_id)) == {two}
    before = leases.get(ADMIN, a_id)
    # Only host 1 is in zone z1, and lease a holds it over [2 h, 6 h): refused without moves.
    c = leases.create(
        ALICE,
        host_request(
            "c", T0 + 4 * HOUR, T0 + 10 * HOUR, resource_properties='["==", "$zone", "z1"]'
        ),
    )
    assert hosts_of(c) == {one}
    after = leases.get(ADMIN, a_id)
    assert hosts_of(after) == {two}, "a moved to the equivalent free host"
    assert (after.start_date, after.end_date, after.status) == (
        before.start_date,
        before.end_date,
        LeaseStatus.PENDING,
    )
    (alloc,) = after.reservations[0].allocations
    assert (alloc.start_date, alloc.end_date) == (before.start_date, before.end_date)
    assert hosts_of(leases.get(ADMIN, b_id)) == {two}
    # The in-memory calendar knows a moved: host 2 is now busy over [2 h, 6 h).
    with pytest.raises(NotEnoughCapacity):
        leases.create(
            BOB,
            host_request(
                "d", T0 + 3 * HOUR, T0 + 5 * HOUR, resource_properties='["==", "$zone", "z2"]'
            ),
        )
    with ctx.db.reader() as session:
        rows = session.execute(
            select(HostAllocation.host_id, HostAllocation.start_date, HostAllocation.end_date)
            .join(Lease, Lease.id == HostAllocation.lease_id)
            .where(Lease.deleted_at.is_(None))
            .order_by(HostAllocation.host_id, HostAllocation.start_date)
        ).all()
    for (h1, _, e1), (h2, s2, _) in itertools.pairwise(rows):
        assert h1 != h2 or e1 <= s2, "a host is booked twice"


def test_service_never_moves_a_started_lease(
    clock: ManualClock, leases: LeaseService, hosts: HostService
) -> None:
    zone_hosts(hosts)
    a_id, _ = layout(leases, T0 + 2 * HOUR)
    clock.set(T0 + 2 * HOUR)  # a starts now (the manager has not run: it is still PENDING)
    with pytest.raises(NotEnoughCapacity):
        leases.create(
            ALICE,
            host_request(
                "c", T0 + 4 * HOUR, T0 + 10 * HOUR, resource_properties='["==", "$zone", "z1"]'
            ),
        )
    assert leases.get(ADMIN, a_id).status == LeaseStatus.PENDING


def test_service_never_moves_a_lease_a_manager_is_starting(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    """A plan that would move a lease whose start event another transaction holds (a manager
    starting it from the hosts it read) is dropped and the search runs again without moving
    it; once the start is free again, the move is made."""
    if ctx.db.dialect != "postgresql":
        pytest.skip("SQLite has one writer: no manager holds an event while admission runs")
    one, two = zone_hosts(hosts)
    a_id, _ = layout(leases, T0 + 2 * HOUR)
    z1 = host_request(
        "c", T0 + 4 * HOUR, T0 + 10 * HOUR, resource_properties='["==", "$zone", "z1"]'
    )
    starting = (
        select(Event)
        .where(Event.lease_id == a_id, Event.event_type == EventType.START_LEASE)
        .with_for_update()
    )
    with ctx.db.transaction() as manager:
        assert manager.scalars(starting).one().status == EventStatus.UNDONE
        with pytest.raises(NotEnoughCapacity):
            leases.create(ALICE, z1)
        assert hosts_of(leases.get(ADMIN, a_id)) == {one}
    assert hosts_of(leases.create(ALICE, z1)) == {one}
    assert hosts_of(leases.get(ADMIN, a_id)) == {two}


def test_service_update_admitted_by_moving_another_pending_lease(
    leases: LeaseService, hosts: HostService
) -> None:
    one, two = zone_hosts(hosts)
    b = leases.create(BOB, host_request("b", T0 + 6 * HOUR, T0 + 8 * HOUR))
    p = leases.create(
        ALICE,
        host_request(
            "p", T0 + 2 * HOUR, T0 + 5 * HOUR, resource_properties='["==", "$zone", "z1"]'
        ),
    )
    assert hosts_of(b) == {one} and hosts_of(p) == {one}
    # p (zone z1: host 1 only) runs on to 7 h, into b's window: b moves to host 2.
    updated = leases.update(ALICE, p.id, LeaseChanges(end=T0 + 7 * HOUR))
    assert hosts_of(updated) == {one}
    moved = leases.get(ADMIN, b.id)
    assert hosts_of(moved) == {two}
    assert (moved.start_date, moved.end_date) == (T0 + 6 * HOUR, T0 + 8 * HOUR)


def test_service_update_may_hand_its_old_host_to_a_moved_lease(
    leases: LeaseService, hosts: HostService
) -> None:
    """The moved lease takes the host the updated lease is leaving: the updated lease's old
    allocation must be gone before the move is written (PostgreSQL's exclusion constraint sees
    every statement, not just the end state)."""
    one, two = zone_hosts(hosts)
    x = leases.create(ALICE, host_request("x", T0 + 10 * HOUR, T0 + 12 * HOUR))
    y = leases.create(BOB, host_request("y", T0 + 10 * HOUR, T0 + 12 * HOUR))
    z = leases.create(
        BOB,
        host_request(
            "z", T0 + 12 * HOUR, T0 + 14 * HOUR, resource_properties='["==", "$zone", "z1"]'
        ),
    )
    assert (hosts_of(x), hosts_of(y), hosts_of(z)) == ({one}, {two}, {one})
    # x moves to [11 h, 13 h): host 1 has z (zone z1, which cannot move), host 2 has y; y can
    # only go where x was.
    updated = leases.update(ALICE, x.id, LeaseChanges(start=T0 + 11 * HOUR, end=T0 + 13 * HOUR))
    assert hosts_of(updated) == {two}
    assert hosts_of(leases.get(ADMIN, y.id)) == {one}
    assert hosts_of(leases.get(ADMIN, z.id)) == {one}


def test_service_swaps_two_pending_leases(leases: LeaseService, hosts: HostService) -> None:
    """a and b trade hosts: every row given up is deleted before any is written, so that
    PostgreSQL's exclusion constraint never sees a host twice."""
    one, two = zone_hosts(hosts)
    a = leases.create(ALICE, host_request("a", T0 + 1 * HOUR, T0 + 5 * HOUR))
    b = leases.create(BOB, host_request("b", T0 + 1 * HOUR, T0 + 3 * HOUR))
    assert hosts_of(a) == {one} and hosts_of(b) == {two}
    c = leases.create(
        ALICE,
        host_request(
            "c", T0 + 4 * HOUR, T0 + 6 * HOUR, resource_properties='["==", "$zone", "z1"]'
        ),
    )
    assert hosts_of(c) == {one}
    assert hosts_of(leases.get(ADMIN, a.id)) == {two}
    assert hosts_of(leases.get(ADMIN, b.id)) == {one}


def test_service_moves_a_lease_straight_to_a_free_host_for_a_request_without_filter(
    leases: LeaseService, hosts: HostService
) -> None:
    """Every host a candidate: the calendar names host 1 (its one lease, a, fits host 2's gap)
    and a moves there."""
    one, two = zone_hosts(hosts)
    a = leases.create(ALICE, host_request("a", T0 + 1 * HOUR, T0 + 5 * HOUR))
    b = leases.create(
        BOB,
        host_request(
            "b", T0 + 6 * HOUR, T0 + 10 * HOUR, resource_properties='["==", "$zone", "z2"]'
        ),
    )
    assert hosts_of(a) == {one} and hosts_of(b) == {two}
    c = leases.create(ALICE, host_request("c", T0 + 4 * HOUR, T0 + 8 * HOUR))
    assert hosts_of(c) == {one}
    assert hosts_of(leases.get(ADMIN, a.id)) == {two}
    assert hosts_of(leases.get(ADMIN, b.id)) == {two}


def test_service_refusal_after_a_move_undoes_it(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    """The second reservation of a lease is refused after the first was admitted by moving a
    pending lease: all is rolled back, the moved lease included, in the database and in the
    in-memory calendar."""
    one, two = zone_hosts(hosts)
    a_id, _ = layout(leases, T0 + 2 * HOUR)
    z1 = host_request(
        "x", T0 + 4 * HOUR, T0 + 10 * HOUR, resource_properties='["==", "$zone", "z1"]'
    )
    too_many = host_request("x", T0 + 4 * HOUR, T0 + 10 * HOUR, min_hosts=3)
    both = replace(z1, reservations=[*z1.reservations, *too_many.reservations])
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, both)
    a = leases.get(ADMIN, a_id)
    assert hosts_of(a) == {one}
    calendar = ctx.resource_types["physical:host"].calendar  # type: ignore[attr-defined]
    with ctx.db.transaction(lock=ADMISSION_LOCK) as session:
        owners = {
            host: {s.owner for s in calendar.overlapping(session, host, T0, T0 + 24 * HOUR)}
            for host in (one, two)
        }
    assert a.reservations[0].id in owners[one]
    assert a.reservations[0].id not in owners[two]


def test_the_time_the_service_gives_a_search_is_a_setting() -> None:
    hosts = PhysicalHostType()
    hosts.configure(Settings(reoptimise_budget_ms=0))
    assert hosts._reoptimise_deadline() is None
    hosts.configure(Settings(reoptimise_budget_ms=40))
    began = time.monotonic()
    deadline = hosts._reoptimise_deadline()
    assert deadline is not None and 0.039 <= deadline - began <= 0.041 + (time.monotonic() - began)
