"""Volume capacity over time: the packing rule against brute force, and reservations of
``virtual:volume`` in leases."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from climate.db.tables import Lease
from climate.errors import InvalidInput, NotEnoughCapacity, ResourceInUse
from climate.planner.capacity import Pool, choose_pool, peak
from climate.services.context import ServiceContext
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from climate.services.volume_pools import VolumePoolService
from tests.conftest import ADMIN, ALICE, BOB, T0

HOUR = dt.timedelta(hours=1)
uses = st.lists(
    st.tuples(st.integers(0, 10), st.integers(1, 5), st.integers(1, 50)).map(
        lambda t: (T0 + t[0] * HOUR, T0 + (t[0] + t[1]) * HOUR, t[2])
    ),
    max_size=8,
)


def brute_peak(held: list[tuple[dt.datetime, dt.datetime, int]], s: int, e: int) -> int:
    """The sum at each whole hour (every start and end is on one), the highest of them."""
    instants = [T0 + h * HOUR for h in range(s, e)]
    return max((sum(a for b, f, a in held if b <= t < f) for t in instants), default=0)


@given(uses, st.integers(0, 12), st.integers(1, 6))
def test_peak_is_the_highest_sum_at_any_instant(
    held: list[tuple[dt.datetime, dt.datetime, int]], s: int, length: int
) -> None:
    assert peak(held, T0 + s * HOUR, T0 + (s + length) * HOUR) == brute_peak(held, s, s + length)


@given(st.lists(uses, min_size=1, max_size=3), st.integers(1, 80), st.integers(0, 10))
def test_the_chosen_pool_fits_and_is_the_tightest(
    pools: list[list[tuple[dt.datetime, dt.datetime, int]]], amount: int, s: int
) -> None:
    start, end = T0 + s * HOUR, T0 + (s + 2) * HOUR
    listed = [Pool(i, f"p{i}", 100, held) for i, held in enumerate(pools)]
    fit = choose_pool(listed, amount, start, end)
    room = {p.id: 100 - brute_peak(list(p.uses), s, s + 2) for p in listed}
    assert fit.free == room[fit.pool.id]
    if any(r >= amount for r in room.values()):
        assert fit.free >= amount
        assert fit.free == min(r for r in room.values() if r >= amount)
    else:
        assert fit.free == max(room.values())


@pytest.fixture
def pools(ctx: ServiceContext) -> VolumePoolService:
    return VolumePoolService(ctx)


def volume_lease(
    name: str, size: int, amount: int = 1, start: int = 1, **extra: object
) -> LeaseRequest:
    fields = {"size_gb": size, "amount": amount, **extra}
    return LeaseRequest(
        name=name,
        start=T0 + start * HOUR,
        end=T0 + (start + 2) * HOUR,
        reservations=[ReservationRequest("virtual:volume", fields)],
    )


def pool_of(lease: Lease) -> list[tuple[int, int]]:
    return [(a.pool_id, a.size_gb) for r in lease.reservations for a in r.volume_allocations]


def test_volumes_share_a_pool_up_to_its_capacity_at_every_instant(
    pools: VolumePoolService, leases: LeaseService
) -> None:
    pool = pools.create(ADMIN, {"name": "ssd", "capacity_gb": 100})
    assert pool_of(leases.create(ALICE, volume_lease("a", 30, 2))) == [(pool.id, 60)]
    assert pool_of(leases.create(BOB, volume_lease("b", 40, start=2))) == [(pool.id, 40)]
    with pytest.raises(NotEnoughCapacity, match="at most 0 GB free"):
        leases.create(BOB, volume_lease("c", 10, start=2))
    # After the first lease ends, 60 GB are back.
    assert pool_of(leases.create(BOB, volume_lease("d", 60, start=3))) == [(pool.id, 60)]


def test_the_tightest_matching_pool_is_chosen(
    pools: VolumePoolService, leases: LeaseService
) -> None:
    big = pools.create(ADMIN, {"name": "big", "capacity_gb": 1000, "tier": "hdd"})
    small = pools.create(ADMIN, {"name": "small", "capacity_gb": 100, "tier": "ssd"})
    assert pool_of(leases.create(ALICE, volume_lease("a", 50))) == [(small.id, 50)]
    assert pool_of(leases.create(ALICE, volume_lease("b", 80))) == [(big.id, 80)]
    ssd = '["==", "$tier", "ssd"]'
    with pytest.raises(NotEnoughCapacity, match="1 pool"):
        leases.create(ALICE, volume_lease("c", 80, resource_properties=ssd))
    assert pool_of(leases.create(ALICE, volume_lease("d", 10, pool="big"))) == [(big.id, 10)]


def test_bad_volume_requests_name_the_field(pools: VolumePoolService, leases: LeaseService) -> None:
    pools.create(ADMIN, {"name": "ssd", "capacity_gb": 100})
    with pytest.raises(
        InvalidInput, match=r"^reservations\[0\].size_gb: Malformed parameter size_gb must be >= 1 "
    ):
        leases.create(ALICE, volume_lease("a", 0))
    with pytest.raises(
        InvalidInput, match=r"^reservations\[0\].amount: Malformed parameter amount must be >= 1"
    ):
        leases.create(ALICE, volume_lease("a", 10, amount=-1))
    with pytest.raises(InvalidInput, match="^size_gb: 3 x 50 GB = 150 GB is more than"):
        leases.create(ALICE, volume_lease("a", 50, amount=3))
    with pytest.raises(InvalidInput, match="^pool: no reservable volume pool named 'hdd'"):
        leases.create(ALICE, volume_lease("a", 10, pool="hdd"))


def test_a_pool_cannot_shrink_below_or_go_while_reservations_need_it(
    pools: VolumePoolService, leases: LeaseService
) -> None:
    pool = pools.create(ADMIN, {"name": "ssd", "capacity_gb": 100})
    lease = leases.create(ALICE, volume_lease("a", 70))
    with pytest.raises(ResourceInUse, match="up to 70 GB reserved"):
        pools.update(ADMIN, str(pool.id), {"capacity_gb": 50})
    assert pools.update(ADMIN, str(pool.id), {"capacity_gb": 70}).capacity_gb == 70
    with pytest.raises(ResourceInUse, match=lease.id):
        pools.delete(ADMIN, str(pool.id))
    leases.delete(ALICE, lease.id)
    pools.delete(ADMIN, str(pool.id))
    assert pools.list_all(ADMIN) == []
