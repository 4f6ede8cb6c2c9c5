"""The hosts' instance uses held in memory (``planner/instance_uses.py``) and kept in step with
``instance_allocations`` by the hosts' calendar, across processes and rollbacks: admission,
searches and timelines read them instead of the table."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.config import Settings
from climate.db import instances as instance_rows
from climate.db.engine import ADMISSION_LOCK, Database
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.planner.instance_search import InstanceHost, InstanceSpace, instance_timeline
from climate.planner.instance_uses import HostUse, InstanceUses
from climate.planner.instances import Size
from climate.resources.capabilities import SharedHosts
from climate.resources.hosts import PhysicalHostType
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, BOB, T0

HOUR = dt.timedelta(hours=1)

# -- the structure against a list -------------------------------------------------------------

uses_of_a_host = st.lists(
    st.builds(
        lambda start, length, vcpus, owner: (start, start + length, vcpus, f"r{owner}"),
        st.integers(0, 20),
        st.integers(1, 6),
        st.integers(1, 8),
        st.integers(0, 5),
    ),
    max_size=4,
)
steps = st.lists(st.tuples(st.integers(0, 4), uses_of_a_host), max_size=40)
queries = st.lists(
    st.tuples(
        st.sets(st.integers(0, 5), max_size=5),
        st.integers(0, 25),
        st.integers(1, 10),
        st.sampled_from(["", "r0", "r1", "r9"]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(steps, queries)
def test_uses_within_a_window_are_those_a_scan_of_every_use_finds(
    history: list[tuple[int, list[tuple[int, int, int, str]]]],
    asked: list[tuple[set[int], int, int, str]],
) -> None:
    held = InstanceUses()
    truth: dict[int, list[HostUse]] = {}
    for host, rows in history:
        new = [HostUse(host, float(s), float(e), v, 2 * v, 3 * v, o) for s, e, v, o in rows]
        assert held.replace_host(host, new) == truth.get(host, [])
        truth[host] = new
    for host, rows in truth.items():
        assert held.of_host(host) == rows
    for hosts, start, length, other_than in asked:
        ids = sorted(hosts)
        end = start + length
        found = held.within(ids, float(start), float(end), other_than)
        expected = sorted(
            (ids.index(u.host_id), u.start, u.end, u.vcpus, u.memory_mb, u.disk_gb)
            for h in ids
            for u in truth.get(h, [])
            if u.start < end and u.end > start and u.owner != other_than
        )
        got = sorted(
            (p, s, e, *size)
            for p, s, e, size in zip(
                found.position.tolist(),
                found.starts.tolist(),
                found.ends.tolist(),
                found.sizes.tolist(),
                strict=True,
            )
        )
        assert got == expected
        # Ordered by host position, then start.
        pairs = list(zip(found.position.tolist(), found.starts.tolist(), strict=True))
        assert pairs == sorted(pairs)


def test_a_host_replaced_many_times_keeps_only_its_last_uses() -> None:
    held = InstanceUses([HostUse(1, 0.0, 1.0, 1, 1, 1, "keep")])
    for round_ in range(500):  # compacts on the way: the dead rows outnumber the live ones
        held.replace_host(2, [HostUse(2, float(round_), round_ + 1.0, 2, 2, 2, f"r{round_}")])
    found = held.within([1, 2], 0.0, 1000.0)
    assert found.position.tolist() == [0, 1]
    assert found.starts.tolist() == [0.0, 499.0]
    assert found.sizes.tolist() == [[1, 1, 1], [2, 2, 2]]


# -- the hosts' calendar keeps them in step with the database ---------------------------------


def sized_hosts(hosts: HostService, count: int) -> list[int]:
    size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
    return [hosts.create(ADMIN, f"compute-{i}", dict(size)).id for i in range(count)]


def instances(name: str, amount: int, start: int = 1, **extra: Any) -> LeaseRequest:
    fields = {"amount": amount, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10, **extra}
    return LeaseRequest(
        name=name,
        start=T0 + start * HOUR,
        end=T0 + (start + 2) * HOUR,
        reservations=[ReservationRequest("virtual:instance", fields)],
    )


def in_memory(ctx: ServiceContext) -> set[tuple[Any, ...]]:
    """Every instance use the context's hosts' calendar holds, caught up under the lock."""
    host_type = ctx.resource_types["physical:host"]
    assert isinstance(host_type, PhysicalHostType)
    with ctx.db.transaction(lock=ADMISSION_LOCK) as session:
        host_type.calendar.synced(session)
        return {
            (u.host_id, u.start, u.end, u.vcpus, u.memory_mb, u.disk_gb, u.owner)
            for host in range(1, 50)
            for u in host_type.calendar.uses.of_host(host)
        }


def in_database(db: Database) -> set[tuple[Any, ...]]:
    with db.reader() as session:
        return {
            (u.host_id, u.start, u.end, u.vcpus, u.memory_mb, u.disk_gb, u.owner)
            for u in instance_rows.uses_since(session, T0 - 30 * 24 * HOUR)
        }


def test_the_instance_type_reads_the_hosts_calendar_of_the_whole_host_type(
    ctx: ServiceContext,
) -> None:
    shared = ctx.resource_types["virtual:instance"]
    whole = ctx.resource_types["physical:host"]
    assert isinstance(whole, PhysicalHostType) and isinstance(shared, SharedHosts)
    assert shared.calendar is whole.calendar


def test_uses_follow_creations_updates_and_deletions_of_two_processes(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    here, there = build_context(settings, db, clock), build_context(settings, db, clock)
    sized_hosts(HostService(here), 4)
    mine, theirs = LeaseService(here), LeaseService(there)
    first = mine.create(ALICE, instances("first", 2))
    assert in_memory(here) == in_database(db) != set()
    second = theirs.create(BOB, instances("second", 3, affinity=False))
    theirs.update(BOB, second.id, LeaseChanges(end=T0 + 5 * HOUR))
    assert in_memory(here) == in_database(db)
    mine.update(ALICE, first.id, LeaseChanges(name="renamed", end=T0 + 4 * HOUR))
    theirs.delete(BOB, second.id)
    assert in_memory(here) == in_memory(there) == in_database(db)


def test_another_process_instances_are_seen_before_the_next_decision(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    here, there = build_context(settings, db, clock), build_context(settings, db, clock)
    sized_hosts(HostService(here), 1)  # room for two instances of 4 vCPUs
    mine, theirs = LeaseService(here), LeaseService(there)
    mine.create(ALICE, instances("warm-up", 1, start=10))  # the calendar is loaded
    theirs.create(BOB, instances("fills-it", 2))
    with pytest.raises(NotEnoughCapacity):
        mine.create(ALICE, instances("no-room", 1))
    theirs.delete(BOB, theirs.list_all(BOB)[0].id)
    assert mine.create(ALICE, instances("room-again", 2)).reservations


def test_a_refused_instance_lease_leaves_no_use_behind(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, db: Database
) -> None:
    sized_hosts(hosts, 1)
    fits = {"amount": 1, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10}
    # The first reservation is placed and written; the second finds no room, so the lease is
    # refused and the first one's use must vanish from memory as from the database.
    request = LeaseRequest(
        "two-parts",
        T0 + HOUR,
        T0 + 3 * HOUR,
        reservations=[
            ReservationRequest("virtual:instance", fits),
            ReservationRequest("virtual:instance", {**fits, "amount": 2}),
        ],
    )
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, request)
    assert in_memory(ctx) == in_database(db) == set()
    assert leases.create(ALICE, instances("both-fit", 2)).reservations


# -- the instance timeline reads them: every host and bucket in one sweep ---------------------

use_rows = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-3, 14), st.integers(1, 8), st.integers(1, 4)),
    max_size=12,
)
whole_rows = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-3, 14), st.integers(1, 6)), max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(2, 8), min_size=1, max_size=4),
    use_rows,
    whole_rows,
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_the_instance_timeline_is_what_each_bucket_leaves_at_its_fullest_instant(
    vcpus: list[int],
    uses: list[tuple[int, int, int, int]],
    wholes: list[tuple[int, int, int]],
    bucket: int,
    wanted: int,
) -> None:
    count, start = 5, 0
    hosts = [InstanceHost(k, f"h{k}", Size(v, 100, 0)) for k, v in enumerate(vcpus)]
    uses = [u for u in uses if u[0] < len(hosts)]
    wholes = [w for w in wholes if w[0] < len(hosts)]
    space = InstanceSpace(
        hosts,
        (
            np.array([w[0] for w in wholes], dtype=np.int64),
            np.array([w[1] for w in wholes], dtype=np.float64),
            np.array([w[1] + w[2] for w in wholes], dtype=np.float64),
        ),
        (
            np.array([u[0] for u in uses], dtype=np.int64),
            np.array([u[1] for u in uses], dtype=np.float64),
            np.array([u[1] + u[2] for u in uses], dtype=np.float64),
            np.array([(u[3], 1, 0) for u in uses], dtype=np.int64).reshape(-1, 3),
        ),
    )
    found = instance_timeline(space, Size(wanted, 1, 0), start, bucket, count)
    # Brute force: each host at every whole instant and half instant of each bucket.
    free, largest = [0] * count, [0] * count
    for i in range(count):
        begin, end = start + i * bucket, start + (i + 1) * bucket
        instants = [t / 2 for t in range(2 * begin, 2 * end)]
        for k, host in enumerate(hosts):
            if any(w[0] == k and w[1] < end and w[1] + w[2] > begin for w in wholes):
                continue
            held = max(
                sum(u[3] for u in uses if u[0] == k and u[1] <= t < u[1] + u[2]) for t in instants
            )
            room = max(host.capacity.vcpus - held, 0) // wanted
            free[i] += room
            largest[i] = max(largest[i], room)
    assert found.total == sum(v // wanted for v in vcpus)
    assert found.free.tolist() == free
    assert found.largest.tolist() == largest


def test_a_host_s_uses_read_again_leave_out_those_ended_before_the_horizon(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, db: Database
) -> None:
    (host,) = sized_hosts(hosts, 1)
    leases.create(ALICE, instances("early", 1, start=1))  # ends at T0 + 3 h
    leases.create(ALICE, instances("later", 1, start=10))  # ends at T0 + 12 h
    with db.reader() as session:
        kept = instance_rows.uses_of(session, [host], T0 + 5 * HOUR)
        every = instance_rows.uses_of(session, [host], T0)
    assert [u.end for u in kept] == [(T0 + 12 * HOUR).timestamp()]
    assert sorted(u.end for u in every) == [
        (T0 + 3 * HOUR).timestamp(),
        (T0 + 12 * HOUR).timestamp(),
    ]
