"""Random creates, updates and deletes of leases mixing whole hosts, instances, floating IPs,
devices and volumes, through the service layer on both databases. After every step the
allocations of live leases, read back from the database, must never over-commit anything at any
instant (no host, address or device twice at once; no host running more instances than its size
holds, nor instances while reserved whole; no pool's sizes above its capacity), and every
refusal must be right: a brute-force count over the allocations just before shows some
reservation could not fit."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from climate.db.tables import (
    Assignment,
    Event,
    HostAllocation,
    InstanceAllocation,
    ItemAllocation,
    Lease,
    OutboxMessage,
    Reservation,
    VolumeAllocation,
)
from climate.db.types import as_utc
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.resources import load_resource_types
from climate.resources.items import DEVICES, FLOATING_IPS
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.items import ItemService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from climate.services.volume_pools import VolumePoolService
from tests.conftest import ADMIN, ALICE, T0
from tests.helpers import add_hosts

STEP = dt.timedelta(minutes=30)
CAPACITY = 100
PER_HOST = 2
"""Instances of INSTANCE a host holds (8 vCPU / 8 GB / 100 GB hosts)."""
INSTANCE = {"vcpus": 4, "memory_mb": 4096, "disk_gb": 10}
Held = tuple[str, int, dt.datetime, dt.datetime, int]
"""What one allocation holds: (table, resource, start, end, GB or 1)."""

ASK = st.fixed_dictionaries(
    {
        "hosts": st.integers(0, 2),
        "instances": st.integers(0, 3),
        "fips": st.integers(0, 3),
        "devices": st.integers(0, 2),
        "gb": st.sampled_from([0, 20, 50, 70]),
    }
).filter(lambda a: any(a.values()))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 6), st.integers(1, 4), ASK),
        st.tuples(st.just("extend"), st.integers(0, 9), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.integers(0, 9)),
    ),
    min_size=1,
    max_size=10,
)


@dataclass(frozen=True)
class Inventory:
    hosts: int
    fips: int
    devices: int


@pytest.fixture
def inventory(ctx: ServiceContext, hosts: HostService) -> Inventory:
    add_hosts(hosts, 2, vcpus=8, memory_mb=8192, local_gb=100)
    fips = ItemService(ctx, FLOATING_IPS)
    for i in range(3):
        fips.create(ADMIN, {"floating_network_id": "net", "floating_ip_address": f"10.0.0.{i}"})
    devices = ItemService(ctx, DEVICES)
    for i in range(2):
        devices.create(ADMIN, {"name": f"dev-{i}"})
    VolumePoolService(ctx).create(ADMIN, {"name": "pool", "capacity_gb": CAPACITY})
    return Inventory(2, 3, 2)


def wipe(ctx: ServiceContext) -> None:
    with ctx.db.transaction() as session:
        for table in (
            HostAllocation,
            InstanceAllocation,
            ItemAllocation,
            VolumeAllocation,
            Assignment,
            OutboxMessage,
            Event,
            Reservation,
            Lease,
        ):
            session.execute(delete(table))
    ctx.resource_types = load_resource_types()


def held_now(ctx: ServiceContext) -> dict[str, list[Held]]:
    """Per live lease, what its allocations hold, straight from the tables."""
    found: dict[str, list[Held]] = {}
    with ctx.db.reader() as session:
        live = select(Lease.id).where(Lease.deleted_at.is_(None))
        for table, model, column, amount in (
            ("host", HostAllocation, HostAllocation.host_id, None),
            ("item", ItemAllocation, ItemAllocation.item_id, None),
            ("pool", VolumeAllocation, VolumeAllocation.pool_id, VolumeAllocation.size_gb),
            ("inst", InstanceAllocation, InstanceAllocation.host_id, InstanceAllocation.count),
        ):
            extra = [amount] if amount is not None else []
            rows = session.execute(
                select(model.lease_id, column, model.start_date, model.end_date, *extra).where(
                    model.lease_id.in_(live)
                )
            )
            for lease_id, resource, start, end, *size in rows:
                held = (table, resource, as_utc(start), as_utc(end), size[0] if size else 1)
                found.setdefault(lease_id, []).append(held)
    return found


def check_never_over_committed(held: Iterable[Held]) -> None:
    listed = list(held)
    instants = sorted({s for _, _, s, _, _ in listed})
    for t in instants:
        using: dict[tuple[str, int], int] = {}
        for table, resource, s, e, size in listed:
            if s <= t < e:
                using[(table, resource)] = using.get((table, resource), 0) + size
        for (table, resource), total in using.items():
            limit = {"pool": CAPACITY, "inst": PER_HOST}.get(table, 1)
            assert total <= limit, (table, resource, t, total)
            if table == "inst":
                assert ("host", resource) not in using, (resource, t, "whole and instances")


def could_fit(
    ask: dict[str, int], inventory: Inventory, others: list[Held], s: dt.datetime, e: dt.datetime
) -> bool:
    """Brute force: whether every reservation of ``ask`` has enough free for [s, e)."""
    busy = {(t, r) for t, r, a, b, _ in others if a < e and s < b and t not in ("pool", "inst")}
    whole = {r for t, r in busy if t == "host"}
    running = {
        host: max(
            sum(n for t, r, a, b, n in others if t == "inst" and r == host and a <= p < b)
            for p in points_in(others, s, e)
        )
        for host in range(1, inventory.hosts + 1)
    }
    free_whole = [h for h in running if h not in whole and running[h] == 0]
    slots = sum(PER_HOST - n for h, n in running.items() if h not in whole)
    # Items: floating IPs have ids 1..3, devices 4..5 (created in that order).
    busy_fips = sum(1 for t, r in busy if t == "item" and r <= inventory.fips)
    busy_devices = sum(1 for t, r in busy if t == "item" and r > inventory.fips)
    points = points_in(others, s, e)
    used = max(sum(g for t, _, a, b, g in others if t == "pool" and a <= p < b) for p in points)
    return (
        len(free_whole) >= ask["hosts"]
        and slots - PER_HOST * ask["hosts"] >= ask["instances"]
        and inventory.fips - busy_fips >= ask["fips"]
        and inventory.devices - busy_devices >= ask["devices"]
        and CAPACITY - used >= ask["gb"]
    )


def points_in(others: list[Held], s: dt.datetime, e: dt.datetime) -> list[dt.datetime]:
    """The instants where what is held over [s, e) can change."""
    return sorted({s} | {a for _, _, a, _, _ in others if s <= a < e})


def reservations(ask: dict[str, int]) -> list[ReservationRequest]:
    found = []
    if ask["hosts"]:
        found.append(
            ReservationRequest("physical:host", {"min": ask["hosts"], "max": ask["hosts"]})
        )
    if ask["instances"]:
        found.append(
            ReservationRequest("virtual:instance", {"amount": ask["instances"], **INSTANCE})
        )
    if ask["fips"]:
        found.append(
            ReservationRequest("virtual:floatingip", {"network_id": "net", "amount": ask["fips"]})
        )
    if ask["devices"]:
        found.append(ReservationRequest("device", {"min": ask["devices"], "max": ask["devices"]}))
    if ask["gb"]:
        found.append(ReservationRequest("virtual:volume", {"size_gb": ask["gb"]}))
    return found


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_mixed_leases_never_over_commit_and_are_refused_only_when_something_is_full(
    ctx: ServiceContext,
    leases: LeaseService,
    inventory: Inventory,
    clock: ManualClock,
    ops: list[tuple[Any, ...]],
) -> None:
    clock.set(T0)
    wipe(ctx)
    asked: dict[str, dict[str, int]] = {}
    for n, op in enumerate(ops):
        before = held_now(ctx)
        if op[0] == "create":
            _, slot, length, ask = op
            s, e = T0 + (slot + 1) * STEP, T0 + (slot + 1 + length) * STEP
            others = [h for held in before.values() for h in held]
            request = LeaseRequest(f"l{n}", s, e, reservations=reservations(ask))
            try:
                lease = leases.create(ALICE, request)
            except NotEnoughCapacity:
                assert not could_fit(ask, inventory, others, s, e), (op, before)
            else:
                asked[lease.id] = ask
        elif asked:
            lease_id = sorted(asked)[op[1] % len(asked)]
            if op[0] == "delete":
                leases.delete(ALICE, lease_id)
                del asked[lease_id]
            else:
                current = leases.get(ALICE, lease_id)
                s, e = current.start_date, current.end_date + op[2] * STEP
                others = [h for k, held in before.items() if k != lease_id for h in held]
                try:
                    leases.update(ALICE, lease_id, LeaseChanges(end=e))
                except NotEnoughCapacity:
                    assert not could_fit(asked[lease_id], inventory, others, s, e), op
                    assert held_now(ctx) == before  # nothing moved
        check_never_over_committed(h for held in held_now(ctx).values() for h in held)
