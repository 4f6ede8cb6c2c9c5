"""A listing reads leases as plain records (``db/lease_views.py``), not through the ORM: every
lease must come out exactly as ``GET /v1/leases/{id}`` shows it, whatever it holds."""

from __future__ import annotations

import datetime as dt

from climate import wire
from climate.backends.standalone import StandaloneBackend
from climate.context import Page
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.resources.items import FLOATING_IPS
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.items import ItemService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from climate.services.volume_pools import VolumePoolService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request
from tests.test_instances import instance_fields, sized_hosts
from tests.test_items import NET, add_fips, fip

HOUR = dt.timedelta(hours=1)


def _every_kind(ctx: ServiceContext, leases: LeaseService, clock: ManualClock) -> list[str]:
    """Leases of every resource kind and in several states; their ids, live ones only."""
    hosts = HostService(ctx)
    sized_hosts(hosts, 5)
    add_fips(ItemService(ctx, FLOATING_IPS), 3)
    VolumePoolService(ctx).create(ADMIN, {"name": "ssd", "capacity_gb": 100})
    mixed = LeaseRequest(
        name="mixed",
        start=T0 + HOUR,
        end=T0 + 5 * HOUR,
        reminders=[2 * HOUR, 3 * HOUR],
        reservations=[
            ReservationRequest(
                "physical:host",
                {"min": 1, "max": 2, "hypervisor_properties": "", "resource_properties": ""},
            ),
            ReservationRequest("virtual:instance", instance_fields(2, affinity=False)),
            ReservationRequest(*fip(2, network=NET)),
            ReservationRequest("virtual:volume", {"size_gb": 30, "amount": 2}),
        ],
    )
    ids = [leases.create(ALICE, mixed).id]
    running = leases.create(ALICE, host_request("running", T0, T0 + 3 * HOUR))
    ids.append(running.id)
    ids.append(leases.create(BOB, host_request("bob's", T0 + 6 * HOUR, T0 + 7 * HOUR)).id)
    gone = leases.create(ALICE, host_request("gone", T0 + 8 * HOUR, T0 + 9 * HOUR))
    leases.delete(ALICE, gone.id)
    Manager(ctx, StandaloneBackend()).run_due()
    clock.advance(HOUR // 2)
    leases.update(ALICE, running.id, LeaseChanges(end=T0 + 4 * HOUR, name="renamed"))
    return ids


def test_a_listed_lease_is_shown_as_its_own_page_shows_it(
    ctx: ServiceContext, leases: LeaseService, clock: ManualClock
) -> None:
    ids = _every_kind(ctx, leases, clock)
    listed = leases.list_all(ADMIN)
    assert sorted(lease.id for lease in listed) == sorted(ids)
    for lease in listed:
        assert wire.lease(lease) == wire.lease(leases.get(ADMIN, lease.id))
    shown = {lease.name: wire.lease(lease) for lease in listed}
    mixed = shown["mixed"]
    assert [r["resource_type"] for r in mixed["reservations"]] == [
        "physical:host",
        "virtual:instance",
        "virtual:floatingip",
        "virtual:volume",
    ]
    assert all(r["allocations"] for r in mixed["reservations"])
    assert [e["event_type"] for e in shown["renamed"]["events"]] == [
        "start_lease",
        "before_end_lease",
        "end_lease",
    ]
    assert shown["renamed"]["status"] == "ACTIVE"


def test_a_listing_pages_and_filters_as_before(
    ctx: ServiceContext, leases: LeaseService, clock: ManualClock
) -> None:
    _every_kind(ctx, leases, clock)
    everyone = [lease.name for lease in leases.list_all(ADMIN, page=Page(sort_key="name"))]
    assert everyone == ["bob's", "mixed", "renamed"]
    first = leases.list_all(ADMIN, page=Page(limit=1, sort_key="name", sort_dir="desc"))
    after = leases.list_all(
        ADMIN, page=Page(limit=5, marker=first[0].id, sort_key="name", sort_dir="desc")
    )
    assert [lease.name for lease in [*first, *after]] == ["renamed", "mixed", "bob's"]
    assert [lease.name for lease in leases.list_all(ALICE, page=Page(sort_key="name"))] == [
        "mixed",
        "renamed",
    ]
    assert [lease.name for lease in leases.list_all(ADMIN, status="ACTIVE")] == ["renamed"]
    assert [lease.name for lease in leases.list_all(ADMIN, name="bob's")] == ["bob's"]
