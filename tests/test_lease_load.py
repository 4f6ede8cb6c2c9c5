"""Loading a whole lease reads only the allocation table each reservation's type has, and gives
every reservation the same four allocation collections as SQLAlchemy's own eager loads."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, select

from climate.db import leases as lease_rows
from climate.db.tables import Lease, Reservation
from climate.resources.items import DEVICES, FLOATING_IPS
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.items import ItemService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from climate.services.volume_pools import VolumePoolService
from tests.conftest import ADMIN, T0
from tests.helpers import add_hosts, host_request

COLLECTIONS = ("allocations", "instance_allocations", "item_allocations", "volume_allocations")
MIXED = [
    ReservationRequest("physical:host", {"min": 1, "max": 1}),
    ReservationRequest(
        "virtual:instance", {"amount": 3, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10}
    ),
    ReservationRequest("virtual:floatingip", {"network_id": "net", "amount": 2}),
    ReservationRequest("device", {"min": 1, "max": 1}),
    ReservationRequest("virtual:volume", {"size_gb": 20}),
]


@pytest.fixture
def mixed_lease(ctx: ServiceContext, hosts: HostService, leases: LeaseService) -> Lease:
    """A lease with a reservation of every built-in type, each holding something."""
    add_hosts(hosts, 3, vcpus=8, memory_mb=8192, local_gb=100)
    fips = ItemService(ctx, FLOATING_IPS)
    for i in range(3):
        fips.create(ADMIN, {"floating_network_id": "net", "floating_ip_address": f"10.0.0.{i}"})
    ItemService(ctx, DEVICES).create(ADMIN, {"name": "dev-0"})
    VolumePoolService(ctx).create(ADMIN, {"name": "pool", "capacity_gb": 100})
    start = T0 + dt.timedelta(hours=1)
    window = (start, start + dt.timedelta(hours=2))
    return leases.create(ADMIN, LeaseRequest("mixed", *window, reservations=MIXED))


def _held(reservation: Reservation) -> dict[str, list[str]]:
    return {name: [a.id for a in getattr(reservation, name)] for name in COLLECTIONS}


@contextmanager
def _selects(ctx: ServiceContext) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(ctx.db.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", count)


def test_a_whole_lease_has_the_allocations_the_eager_loads_give(
    ctx: ServiceContext, mixed_lease: Lease
) -> None:
    lease = mixed_lease
    with ctx.db.reader() as session:
        expected = {
            r.id: _held(r)
            for r in session.scalars(select(Reservation).where(Reservation.lease_id == lease.id))
        }
    assert all(any(held.values()) for held in expected.values())
    for locked in (False, True):
        with ctx.db.transaction() as session:
            loaded = lease_rows.get(session, lease.id, locked=locked)
            assert loaded is not None
            assert {r.id: _held(r) for r in loaded.reservations} == expected
            assert len(loaded.events) == len(lease.events)


def test_a_whole_lease_loaded_after_a_part_of_it_gets_its_allocations(
    ctx: ServiceContext, mixed_lease: Lease
) -> None:
    lease = mixed_lease
    with ctx.db.transaction() as session:
        part = lease_rows.get(session, lease.id, whole=False)
        assert part is not None
        whole = lease_rows.get(session, lease.id, locked=True)
        assert whole is part
        kinds = {r.resource_type: _held(r) for r in whole.reservations}
    assert len(kinds["physical:host"]["allocations"]) == 1
    assert sum(1 for v in kinds["physical:host"].values() if v) == 1
    assert kinds["virtual:instance"]["instance_allocations"]
    assert len(kinds["virtual:floatingip"]["item_allocations"]) == 2
    assert kinds["device"]["item_allocations"] and kinds["virtual:volume"]["volume_allocations"]


def test_a_host_lease_is_loaded_whole_in_four_reads(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    lease = leases.create(ADMIN, host_request("one", T0, T0 + dt.timedelta(hours=1)))
    with ctx.db.reader() as session, _selects(ctx) as seen:
        loaded = lease_rows.get(session, lease.id)
        assert loaded is not None
        assert len(loaded.reservations[0].allocations) == 1
        assert loaded.reservations[0].instance_allocations == []
    tables = sorted(re.search(r"\bFROM\s+(\w+)", s).group(1) for s in seen)  # type: ignore[union-attr]
    assert tables == ["events", "host_allocations", "leases", "reservations"]


def test_an_update_and_a_delete_read_the_lease_once(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    """The event hold and the lease load share one read of the lease (SQLite: the hold loads
    it whole and keeps it for the transaction; PostgreSQL: the hold reads events only)."""
    add_hosts(hosts, 2)
    lease = leases.create(ADMIN, host_request("one", T0, T0 + dt.timedelta(hours=1)))
    longer = LeaseChanges(end=T0 + dt.timedelta(hours=2))
    for change in (
        lambda: leases.update(ADMIN, lease.id, longer),
        lambda: leases.delete(ADMIN, lease.id),
    ):
        with _selects(ctx) as seen:
            change()
        whole = [s for s in seen if re.search(r"\bFROM\s+leases\b", s) and "leases.name" in s]
        assert len(whole) == 1, whole
