"""Admission through the service layer, against the database, on random sequences of operations.

Random creates, updates (move the end, change max) and deletes of host leases on 4 hosts, all
within a few hours of T0 on a clock stopped at T0. After every step, SQL over host_allocations
(of live leases) must show no host allocated twice at once; and every admission decision must be
the one a brute-force count of free hosts, taken from the database just before, predicts: if at
least min hosts are free for the whole window, granted min(max, free) of them and nothing else
moves; otherwise refused, or granted min..max hosts thanks to other pending leases, not started,
moving to other hosts with the same window and count (re-optimisation, docs/planning.md; its
completeness is checked against a brute force in tests/test_repack.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import bindparam, delete, select, text

from climate.db.tables import (
    Assignment,
    Event,
    HostAllocation,
    Lease,
    OutboxMessage,
    Reservation,
)
from climate.db.types import UTCDateTime
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.resources import load_resource_types
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService, ReservationRequest
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

STEP = dt.timedelta(minutes=30)  # windows on a coarse grid, so that they touch and overlap often
HOSTS = 4

OVERLAPS = text(
    """
    SELECT a.host_id, a.lease_id, b.lease_id
    FROM host_allocations a
    JOIN host_allocations b
      ON a.host_id = b.host_id AND a.id < b.id
     AND a.start_date < b.end_date AND b.start_date < a.end_date
    JOIN leases la ON la.id = a.lease_id
    JOIN leases lb ON lb.id = b.lease_id
    WHERE la.deleted_at IS NULL AND lb.deleted_at IS NULL
    """
)
# Allocations a deleted lease still holds after now (none may: the clock stays at T0 and every
# window starts at or after it).
DELETED_LEFTOVERS = text(
    """
    SELECT count(*) FROM host_allocations a JOIN leases l ON l.id = a.lease_id
    WHERE l.deleted_at IS NOT NULL AND a.end_date > :now
    """
).bindparams(bindparam("now", type_=UTCDateTime()))


@dataclass(frozen=True)
class Allocation:
    host_id: int
    lease_id: str
    start: dt.datetime
    end: dt.datetime


@dataclass
class Live:
    """What the test knows of a live lease."""

    lease_id: str
    reservation_id: str
    start: dt.datetime
    end: dt.datetime
    min: int
    max: int


# Operations: ("create", start step, length in steps, min, max), ("end", which, length),
# ("max", which, max), ("delete", which); "which" picks a live lease modulo their number.
COUNT = st.integers(1, 3)  # min and max of hosts (max below min is raised to min)
CREATE = st.tuples(st.just("create"), st.integers(0, 5), st.integers(1, 3), COUNT, COUNT)
OPS = st.lists(
    st.one_of(
        CREATE,
        CREATE,  # twice as likely as the others, so that the hosts fill up
        st.tuples(st.just("end"), st.integers(0, 20), st.integers(1, 6)),
        st.tuples(st.just("max"), st.integers(0, 20), COUNT),
        st.tuples(st.just("delete"), st.integers(0, 20)),
    ),
    min_size=4,
    max_size=10,
)


def wipe(ctx: ServiceContext) -> None:
    """Forget every lease (hosts stay): each generated sequence starts from empty calendars."""
    with ctx.db.transaction() as session:
        for table in (HostAllocation, Assignment, OutboxMessage, Event, Reservation, Lease):
            session.execute(delete(table))
    # Deleting rows behind the service's back: the in-memory calendars must start afresh too.
    ctx.resource_types = load_resource_types()


def snapshot(ctx: ServiceContext) -> list[Allocation]:
    """The live allocations, after checking in SQL that no host is allocated twice at once."""
    with ctx.db.reader() as session:
        assert session.execute(OVERLAPS).all() == []
        assert session.execute(DELETED_LEFTOVERS, {"now": ctx.clock.now()}).scalar_one() == 0
        rows = session.execute(
            select(
                HostAllocation.host_id,
                HostAllocation.lease_id,
                HostAllocation.start_date,
                HostAllocation.end_date,
            )
            .join(Lease, Lease.id == HostAllocation.lease_id)
            .where(Lease.deleted_at.is_(None))
            .order_by(HostAllocation.host_id, HostAllocation.start_date, HostAllocation.lease_id)
        ).all()
    return [Allocation(*row) for row in rows]


def free_hosts(
    allocations: list[Allocation],
    host_ids: list[int],
    start: dt.datetime,
    end: dt.datetime,
    ignore_lease: str | None = None,
) -> set[int]:
    """Brute force: hosts with no allocation (but the lease's own) overlapping [start, end)."""
    return {
        h
        for h in host_ids
        if not any(
            a.host_id == h and a.lease_id != ignore_lease and a.start < end and start < a.end
            for a in allocations
        )
    }


def check_live(live: dict[str, Live], allocations: list[Allocation]) -> None:
    """Every live lease holds min..max hosts, each for exactly its window, and nothing else."""
    by_lease: dict[str, list[Allocation]] = {}
    for a in allocations:
        by_lease.setdefault(a.lease_id, []).append(a)
    assert set(by_lease) == set(live)
    for lease_id, lease in live.items():
        rows = by_lease[lease_id]
        assert lease.min <= len(rows) <= lease.max
        assert {(a.start, a.end) for a in rows} == {(lease.start, lease.end)}


def step(
    op: tuple[Any, ...],
    n: int,
    ctx: ServiceContext,
    leases: LeaseService,
    host_ids: list[int],
    live: dict[str, Live],
    before: list[Allocation],
) -> list[Allocation]:
    """Run one operation, check its admission decision against the brute-force count of free
    hosts in ``before``, and return the allocations after it."""
    kind = op[0]
    target: Live | None = None
    if kind == "create":
        _, first, length, minimum, maximum = op
        start, end = T0 + first * STEP, T0 + (first + length) * STEP
        maximum = max(minimum, maximum)
    else:
        if not live:
            return before
        target = sorted(live.values(), key=lambda x: x.lease_id)[op[1] % len(live)]
        if kind == "delete":
            leases.delete(ALICE, target.lease_id)
            del live[target.lease_id]
            return snapshot(ctx)
        start, end, minimum, maximum = target.start, target.end, target.min, target.max
        if kind == "end":
            end = start + op[2] * STEP
        else:
            maximum = max(minimum, op[2])
    free = free_hosts(before, host_ids, start, end, target.lease_id if target else None)
    try:
        if target is None:
            lease = leases.create(ALICE, host_request(f"lease-{n}", start, end, minimum, maximum))
            lease_id, reservation_id = lease.id, lease.reservations[0].id
        else:
            if kind == "end":
                changes = LeaseChanges(end=end)
            else:
                request = ReservationRequest(
                    "physical:host", {"max": maximum}, target.reservation_id
                )
                changes = LeaseChanges(reservations=[request])
            leases.update(ALICE, target.lease_id, changes)
            lease_id, reservation_id = target.lease_id, target.reservation_id
    except NotEnoughCapacity as exc:
        assert len(free) < minimum, f"refused with {len(free)} free for min {minimum}: {exc}"
        after = snapshot(ctx)
        assert after == before  # a refused change leaves everything as it was
        return after
    after = snapshot(ctx)
    if target is not None and kind == "end" and end == target.end:
        assert after == before  # same window, same parameters: nothing is re-planned
        return after
    granted = {a.host_id for a in after if a.lease_id == lease_id}
    others_before = [a for a in before if a.lease_id != lease_id]
    others_after = [a for a in after if a.lease_id != lease_id]
    if len(free) >= minimum:
        assert granted <= free
        assert len(granted) == min(maximum, len(free))
        assert others_after == others_before  # nothing else moves when there is room
    else:
        # Admitted by moving pending leases that have not started: each keeps its window and its
        # count (check_live); no host is booked twice (snapshot).
        assert minimum <= len(granted) <= maximum
        moved = {a.lease_id for a in set(others_before) ^ set(others_after)}
        assert moved, f"granted with only {len(free)} free for min {minimum} and no move"
        for moved_id in moved:
            assert live[moved_id].start > ctx.clock.now(), "a started lease was moved"
            was = [(a.start, a.end) for a in others_before if a.lease_id == moved_id]
            now = [(a.start, a.end) for a in others_after if a.lease_id == moved_id]
            assert was == now, "a moved lease changed its window or its count"
    live[lease_id] = Live(lease_id, reservation_id, start, end, minimum, maximum)
    return after


@pytest.fixture
def host_ids(hosts: HostService) -> list[int]:
    return add_hosts(hosts, HOSTS)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
# Found in CI: a lease deleted as it starts keeps an empty allocation, which hid the next lease
# of its host from the calendar.
@example(
    ops=[("create", 0, 1, 1, 1), ("delete", 0), ("create", 0, 1, 1, 1), ("create", 0, 1, 1, 1)]
)
def test_random_operations_never_double_book_and_refuse_only_when_full(
    ctx: ServiceContext,
    leases: LeaseService,
    host_ids: list[int],
    clock: ManualClock,
    ops: list[tuple[Any, ...]],
) -> None:
    # The fixtures live across examples: start each from no leases, on a clock at T0.
    clock.set(T0)
    wipe(ctx)
    live: dict[str, Live] = {}
    allocations = snapshot(ctx)
    assert allocations == []
    for n, op in enumerate(ops):
        allocations = step(op, n, ctx, leases, host_ids, live, allocations)
        check_live(live, allocations)
