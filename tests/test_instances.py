"""Instances sharing host capacity: the placement rule against an exhaustive search, and
``virtual:instance`` reservations in leases, beside whole hosts."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.config import load_settings
from climate.db.tables import Lease
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity, ResourceInUse
from climate.planner.instances import HostRoom, InstanceDemand, Size, check_possible, place
from climate.resources import load_resource_types
from climate.resources.instances import affinity_field
from climate.runtime import build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from climate.wire import reservation as render_reservation
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request, hosts_of

HOUR = dt.timedelta(hours=1)

# -- the pure planner against brute force -----------------------------------------------------

sizes = st.builds(Size, st.integers(1, 3), st.integers(1, 3), st.integers(0, 2))
uses = st.lists(
    st.tuples(st.integers(0, 5), st.integers(1, 3), sizes).map(
        lambda t: (T0 + t[0] * HOUR, T0 + (t[0] + t[1]) * HOUR, t[2])
    ),
    max_size=4,
)
rooms = st.lists(
    st.tuples(st.builds(Size, st.integers(1, 6), st.integers(1, 6), st.integers(0, 4)), uses),
    min_size=1,
    max_size=3,
).map(lambda hs: [HostRoom(i + 1, f"h{i + 1}", cap, held) for i, (cap, held) in enumerate(hs)])


def fits_at_every_hour(host: HostRoom, count: int, size: Size, s: int, e: int) -> bool:
    """Brute force: at each whole hour of [s, e) (every start and end is on one), what others
    use plus ``count`` instances stays within the host's capacity, per resource."""
    for hour in range(s, e):
        t = T0 + hour * HOUR
        used = [0, 0, 0]
        for b, f, u in host.uses:
            if b <= t < f:
                used = [a + b2 for a, b2 in zip(used, u.as_tuple(), strict=True)]
        ours = size.times(count).as_tuple()
        cap = host.capacity.as_tuple()
        if any(used[k] + ours[k] > cap[k] for k in range(3)):
            return False
    return True


def allowed(counts: dict[int, int], affinity: bool | None) -> bool:
    used = [c for c in counts.values() if c]
    if affinity is True:
        return len(used) <= 1
    if affinity is False:
        return all(c <= 1 for c in used)
    return True


def every_placement(hosts: list[HostRoom], amount: int) -> list[dict[int, int]]:
    ranges = [range(amount + 1)] * len(hosts)
    return [
        {h.id: c for h, c in zip(hosts, combo, strict=True)}
        for combo in itertools.product(*ranges)
        if sum(combo) == amount
    ]


def never_over_committed(hosts: list[HostRoom]) -> bool:
    """What others use is itself within capacity (admission keeps it so)."""
    return all(fits_at_every_hour(h, 0, Size(0, 0, 0), 0, 10) for h in hosts)


@settings(max_examples=300, deadline=None)
@given(
    rooms.filter(never_over_committed),
    st.integers(1, 4),
    sizes,
    st.sampled_from([True, False, None]),
    st.integers(0, 5),
)
def test_placement_never_over_commits_and_refuses_only_what_no_placement_fits(
    hosts: list[HostRoom], amount: int, size: Size, affinity: bool | None, s: int
) -> None:
    start, end = T0 + s * HOUR, T0 + (s + 2) * HOUR
    demand = InstanceDemand(start, end, amount, size, affinity)
    by_id = {h.id: h for h in hosts}
    feasible = [
        p
        for p in every_placement(hosts, amount)
        if allowed(p, affinity)
        and all(fits_at_every_hour(by_id[h], c, size, s, s + 2) for h, c in p.items())
    ]
    try:
        placed = place(demand, hosts)
    except NotEnoughCapacity:
        assert feasible == []
        return
    assert sum(placed.values()) == amount
    assert allowed(placed, affinity)
    for host_id, count in placed.items():
        assert fits_at_every_hour(by_id[host_id], count, size, s, s + 2)
    if affinity is True:
        (chosen,) = placed

        def spare(h: HostRoom) -> int:
            n = amount
            while fits_at_every_hour(h, n + 1, size, s, s + 2):
                n += 1
            return n - amount

        able = [h for h in hosts if fits_at_every_hour(h, amount, size, s, s + 2)]
        assert spare(by_id[chosen]) == min(spare(h) for h in able)


@given(rooms, st.integers(1, 8), sizes)
def test_what_no_empty_host_holds_is_bad_input_or_an_affinity_conflict(
    hosts: list[HostRoom], amount: int, size: Size
) -> None:
    empty = [HostRoom(h.id, h.name, h.capacity) for h in hosts]
    demand = InstanceDemand(T0, T0 + HOUR, amount, size, True)
    holds_one = [h for h in empty if fits_at_every_hour(h, 1, size, 0, 1)]
    holds_all = [h for h in empty if fits_at_every_hour(h, amount, size, 0, 1)]
    # What the hosts hold meanwhile does not count: an empty host could ever hold it or not.
    if not holds_one:
        with pytest.raises(InvalidInput):
            check_possible(demand, hosts)
    elif not holds_all:
        with pytest.raises(Conflict, match="^affinity: "):
            check_possible(demand, hosts)
    else:
        check_possible(demand, hosts)


def test_running_instances_stay_where_they_are() -> None:
    hosts = [HostRoom(1, "a", Size(4, 4, 4)), HostRoom(2, "b", Size(8, 8, 8))]
    kept = InstanceDemand(T0, T0 + HOUR, 3, Size(1, 1, 1), None, keep={1: 2})
    assert place(kept, hosts) == {1: 3}
    with pytest.raises(
        Conflict, match="^amount: Instance reservation doesn.t allow to reduce.*runs 2 instances"
    ):
        place(InstanceDemand(T0, T0 + HOUR, 1, Size(1, 1, 1), None, keep={1: 2}), hosts)


# -- reservations in leases -------------------------------------------------------------------


def sized_hosts(hosts: HostService, count: int, **fields: Any) -> list[int]:
    size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100, **fields}
    return [hosts.create(ADMIN, f"compute-{i}", dict(size)).id for i in range(count)]


def instance_fields(amount: int = 1, **extra: Any) -> dict[str, Any]:
    return {"amount": amount, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10, **extra}


def instance_lease(name: str, amount: int = 1, start: int = 1, **extra: Any) -> LeaseRequest:
    return LeaseRequest(
        name=name,
        start=T0 + start * HOUR,
        end=T0 + (start + 2) * HOUR,
        reservations=[ReservationRequest("virtual:instance", instance_fields(amount, **extra))],
    )


def placement(lease: Lease) -> dict[int, int]:
    return {a.host_id: a.count for r in lease.reservations for a in r.instance_allocations}


def test_instances_share_hosts_up_to_their_size_at_every_instant(
    hosts: HostService, leases: LeaseService
) -> None:
    first, second = sized_hosts(hosts, 2)
    assert placement(leases.create(ALICE, instance_lease("a", 3))) == {first: 2, second: 1}
    # Best fit: the half-used host takes the next one, the other stays whole for longer.
    assert placement(leases.create(BOB, instance_lease("b", 1, start=2))) == {second: 1}
    with pytest.raises(NotEnoughCapacity, match="room for 0 more for the whole window"):
        leases.create(BOB, instance_lease("c", 1, start=2))
    # After the first lease ends, its capacity is back.
    assert sum(placement(leases.create(BOB, instance_lease("d", 2, start=3))).values()) == 2


def test_affinity_puts_all_on_one_host_or_each_on_its_own(
    hosts: HostService, leases: LeaseService
) -> None:
    sized_hosts(hosts, 3)
    together = placement(leases.create(ALICE, instance_lease("a", 2, affinity="True")))
    assert sorted(together.values()) == [2]
    apart = placement(leases.create(ALICE, instance_lease("b", 2, affinity="False")))
    assert sorted(apart.values()) == [1, 1]
    assert not set(apart) & set(together)
    with pytest.raises(NotEnoughCapacity, match="each on a distinct host"):
        leases.create(ALICE, instance_lease("c", 3, affinity=False))


def test_whole_hosts_and_instances_exclude_each_other_in_time(
    hosts: HostService, leases: LeaseService
) -> None:
    first, second = sized_hosts(hosts, 2)
    whole = leases.create(ALICE, host_request("whole", T0 + HOUR, T0 + 3 * HOUR))
    (taken,) = hosts_of(whole)
    other = second if taken == first else first
    small = leases.create(BOB, instance_lease("small", 1))
    assert placement(small) == {other: 1}
    # Neither host is free whole now, in that window; after it, both are.
    with pytest.raises(NotEnoughCapacity, match="0 free for the whole window"):
        leases.create(BOB, host_request("more", T0 + 2 * HOUR, T0 + 4 * HOUR))
    later = leases.create(BOB, host_request("later", T0 + 3 * HOUR, T0 + 4 * HOUR, 2))
    assert hosts_of(later) == {first, second}
    # Deleting the instances frees their host for a whole-host request at once.
    leases.delete(BOB, small.id)
    assert hosts_of(leases.create(BOB, host_request("now", T0 + HOUR, T0 + 2 * HOUR))) == {other}


def test_one_lease_mixing_both_never_puts_them_on_one_host(
    hosts: HostService, leases: LeaseService
) -> None:
    sized_hosts(hosts, 2)
    request = LeaseRequest(
        name="mixed",
        start=T0 + HOUR,
        end=T0 + 2 * HOUR,
        reservations=[
            ReservationRequest("virtual:instance", instance_fields(1)),
            ReservationRequest("physical:host", {"min": 1, "max": 1}),
        ],
    )
    lease = leases.create(ALICE, request)
    assert not set(placement(lease)) & hosts_of(lease)
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, host_request("none-left", T0 + HOUR, T0 + 2 * HOUR))


def test_another_process_sees_instance_usage_as_busy(
    hosts: HostService, leases: LeaseService, ctx: ServiceContext
) -> None:
    """A second service context (another process) keeps its own calendar of whole hosts: it
    learns of the first's instances through the allocation change log."""
    (only,) = sized_hosts(hosts, 1)
    other = LeaseService(build_context(ctx.settings, ctx.db, ctx.clock))
    assert other.create(ALICE, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    leases.create(ALICE, instance_lease("small", 1))
    with pytest.raises(NotEnoughCapacity):
        other.create(BOB, host_request("whole", T0 + HOUR, T0 + 2 * HOUR))
    assert hosts_of(other.create(BOB, host_request("after", T0 + 3 * HOUR, T0 + 4 * HOUR))) == {
        only
    }


def test_pending_whole_hosts_are_not_moved_onto_instance_usage(
    hosts: HostService, leases: LeaseService
) -> None:
    """Late binding may move a pending whole-host lease to an equivalent host, but never to
    one running instances in its window."""
    first, second = sized_hosts(hosts, 2)
    a = leases.create(ALICE, host_request("a", T0 + HOUR, T0 + 3 * HOUR))
    leases.create(BOB, instance_lease("small", 1, start=1))
    with pytest.raises(NotEnoughCapacity):
        leases.create(BOB, host_request("b", T0 + HOUR, T0 + 2 * HOUR))
    assert hosts_of(leases.get(ALICE, a.id)) in ({first}, {second})


AMOUNT_TOO_SMALL = r"^reservations\[0\].amount: Malformed parameter amount must be >= 1"


def test_sizes_and_amounts_no_host_could_hold_are_bad_input(
    hosts: HostService, leases: LeaseService
) -> None:
    sized_hosts(hosts, 2)
    with pytest.raises(InvalidInput, match=r"^vcpus: no host has 64 vCPUs"):
        leases.create(ALICE, instance_lease("a", 1, vcpus=64))
    with pytest.raises(InvalidInput, match=r"^memory_mb: no host has 9000 MB"):
        leases.create(ALICE, instance_lease("a", 1, memory_mb=9000))
    with pytest.raises(InvalidInput, match=AMOUNT_TOO_SMALL):
        leases.create(ALICE, instance_lease("a", 0))
    with pytest.raises(InvalidInput, match=AMOUNT_TOO_SMALL):
        leases.create(ALICE, instance_lease("a", -2))
    with pytest.raises(
        InvalidInput,
        match=r"^reservations\[0\].affinity: Malformed parameter affinity \(must be a bool",
    ):
        leases.create(ALICE, instance_lease("a", 1, affinity="maybe"))
    with pytest.raises(Conflict, match="^affinity: 3 instances .* more than one host's worth"):
        leases.create(ALICE, instance_lease("a", 3, affinity=True))
    assert leases.list_all(ALICE) == []


def test_hosts_without_a_size_are_not_candidates(hosts: HostService, leases: LeaseService) -> None:
    hosts.create(ADMIN, "bare", {})
    for _ in range(2):  # the second from what the first found
        with pytest.raises(InvalidInput, match=r"^hosts.vcpus: 1 host\(s\) match .* none has"):
            leases.create(ALICE, instance_lease("a", 1))
    (sized,) = sized_hosts(hosts, 1)
    assert placement(leases.create(ALICE, instance_lease("a", 1))) == {sized: 1}
    hosts.update(ADMIN, sized, {"vcpus": 2})  # too small now: seen at once
    with pytest.raises(InvalidInput, match=r"^vcpus: no host has 4 vCPUs"):
        leases.create(ALICE, instance_lease("b", 1))


def test_allocation_ratios_scale_a_host_per_host_or_globally(
    hosts: HostService, leases: LeaseService, ctx: ServiceContext
) -> None:
    with pytest.raises(InvalidInput, match="^cpu_allocation_ratio: must be a number above 0"):
        hosts.create(ADMIN, "bad", {"vcpus": 8, "cpu_allocation_ratio": "-1"})
    with pytest.raises(InvalidInput, match="^ram_allocation_ratio: must be a number above 0"):
        hosts.create(ADMIN, "bad", {"vcpus": 8, "ram_allocation_ratio": "lots"})
    (host,) = sized_hosts(hosts, 1, cpu_allocation_ratio=2, ram_allocation_ratio="2.0")
    # 8 vCPU x 2 = 16: four instances of 4 vCPU.
    assert placement(leases.create(ALICE, instance_lease("a", 4))) == {host: 4}
    with pytest.raises(InvalidInput, match="^CLIMATE_CPU_ALLOCATION_RATIO: must be above 0"):
        load_settings(env={"CLIMATE_CPU_ALLOCATION_RATIO": "0"})
    doubled = load_settings(env={}, disk_allocation_ratio=3.0)
    other = LeaseService(build_context(doubled, ctx.db, ctx.clock))
    assert placement(other.create(ALICE, instance_lease("b", 1, start=5, disk_gb=250))) == {host: 1}


def test_updates_change_amount_and_size_and_a_running_one_keeps_its_instances(
    hosts: HostService, leases: LeaseService, ctx: ServiceContext
) -> None:
    first, second = sized_hosts(hosts, 2)
    lease = leases.create(ALICE, instance_lease("a", 2, start=0))
    rid = lease.reservations[0].id
    grown = leases.update(
        ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, {"amount": 3}, rid)])
    )
    assert sum(placement(grown).values()) == 3
    assert lease.reservations[0].updated_at is None
    assert grown.reservations[0].updated_at == ctx.clock.now()
    with pytest.raises(NotEnoughCapacity):
        leases.update(
            ALICE,
            lease.id,
            LeaseChanges(reservations=[ReservationRequest(None, {"vcpus": 8}, rid)]),
        )
    assert placement(leases.get(ALICE, lease.id)) == placement(grown)
    resized = leases.update(
        ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, {"vcpus": 2}, rid)])
    )
    rows = resized.reservations[0].instance_allocations
    assert sum(a.count for a in rows) == 3
    assert all(a.vcpus == 2 * a.count for a in rows)
    assert {a.host_id for a in rows} <= {first, second}
    manager = build_workers(ctx).manager
    ctx.clock.advance(dt.timedelta(seconds=1))  # type: ignore[attr-defined]
    assert manager.run_due() == 1
    before = placement(leases.get(ALICE, lease.id))
    for change in ({"vcpus": 1}, {"affinity": True}, {"amount": 3, "resource_properties": ""}):
        with pytest.raises(Conflict, match="An active reservation only accepts to update amount"):
            leases.update(
                ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, change, rid)])
            )
    with pytest.raises(Conflict, match="^amount: Instance reservation doesn't allow to reduce"):
        leases.update(
            ALICE,
            lease.id,
            LeaseChanges(reservations=[ReservationRequest(None, {"amount": 1}, rid)]),
        )
    assert placement(leases.get(ALICE, lease.id)) == before


def test_a_running_reservation_that_grows_holds_its_new_instances_from_then_on(
    hosts: HostService, leases: LeaseService, ctx: ServiceContext
) -> None:
    """As healing dates what it places: instances added to a running reservation are held
    from when they were added; those it held keep their dates, and the reservation shows what
    it holds per host, once each."""
    sized_hosts(hosts, 2)
    lease = leases.create(ALICE, instance_lease("a", 1, start=0))
    build_workers(ctx).manager.run_due()
    (first,) = placement(leases.get(ALICE, lease.id))
    ctx.clock.advance(dt.timedelta(minutes=10))  # type: ignore[attr-defined]
    rid = lease.reservations[0].id
    more = LeaseChanges(reservations=[ReservationRequest(None, {"amount": 3}, rid)])
    grown = leases.update(ALICE, lease.id, more).reservations[0]
    added = T0 + dt.timedelta(minutes=10)
    dates = sorted(
        (a.start_date, a.end_date) for a in grown.instance_allocations for _ in range(a.count)
    )
    assert dates == [(T0, T0 + 2 * HOUR)] + [(added, T0 + 2 * HOUR)] * 2
    assert [a.host_id for a in grown.instance_allocations if a.start_date == T0] == [first]
    shown = render_reservation(leases.get(ALICE, lease.id).reservations[0])["hosts"]
    assert sum(h["count"] for h in shown) == 3
    assert len({h["host_id"] for h in shown}) == len(shown)


def test_a_host_with_instances_cannot_be_deleted(hosts: HostService, leases: LeaseService) -> None:
    (host,) = sized_hosts(hosts, 1)
    lease = leases.create(ALICE, instance_lease("a", 1))
    with pytest.raises(ResourceInUse, match=lease.id):
        hosts.delete(ADMIN, str(host))
    leases.delete(ALICE, lease.id)
    hosts.delete(ADMIN, str(host))


def test_the_reservation_shows_what_the_backend_needs(
    hosts: HostService, leases: LeaseService
) -> None:
    (host,) = sized_hosts(hosts, 1)
    lease = leases.create(ALICE, instance_lease("a", 2, affinity=True))
    body = render_reservation(lease.reservations[0])
    assert body["resource_type"] == "virtual:instance"
    assert (body["amount"], body["vcpus"], body["memory_mb"], body["disk_gb"]) == (2, 4, 4096, 10)
    assert body["affinity"] is True
    assert body["flavor_id"] == body["aggregate_id"] == lease.reservations[0].id
    assert body["server_group_id"]
    assert body["hosts"] == [{"host_id": str(host), "count": 2}]
    assert [(a["resource_id"], a["count"]) for a in body["allocations"]] == [(str(host), 2)]
    assert load_resource_types()["virtual:instance"].resource_ids(lease.reservations[0]) == [
        f"{host}:0",
        f"{host}:1",
    ]


@pytest.mark.parametrize(
    ("given", "taken"),
    [
        (True, True),
        ("True", True),
        ("yes", True),
        ("T", True),
        (1, True),
        ("off", False),
        ("0", False),
        (0, False),
        (None, None),
        ("None", None),
        ("none", None),
    ],
)
def test_affinity_takes_what_blazar_takes(given: object, taken: bool | None) -> None:
    assert affinity_field({"affinity": given}, "r") is taken


@pytest.mark.parametrize("given", ["", "null", "NONE", " true", "maybe", 2, 1.0, [], {}])
def test_affinity_refuses_what_blazar_refuses(given: object) -> None:
    """Blazar's ``NONE_VALUES`` are None, "None" and "none"; any other value must be one of
    oslo's boolean strings (which 1 and 0 also are)."""
    with pytest.raises(InvalidInput, match=r"^r\.affinity: Malformed parameter affinity \(must"):
        affinity_field({"affinity": given}, "r")
