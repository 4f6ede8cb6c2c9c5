"""Best-effort reclaim on the real rig: a waiting best-effort lease takes a compute whose only
user is another project's running instance reservation, whose real server Nova live-migrates to
another compute (with the reservation's aggregate membership and Placement inventory), and the
best-effort lease then holds the freed compute in its own aggregate. Proved with openstacksdk
calls. SQLite only (each run costs the shared rig a live migration)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from climate.backends.base import Timeboxed
from climate.backends.openstack.placement import resource_class
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.domain.status import LeaseType
from climate.manager.service import Manager
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN
from tests.openstack.conftest import Member, aggregate, boot, lease_now
from tests.openstack.test_nova_healing import _inventory

HOUR = dt.timedelta(hours=1)
GPU = '["=", "$gpu", "a100"]'


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def test_a_best_effort_lease_reclaims_a_compute_by_live_migrating_a_real_server(
    climate: Any,
    cloud: Any,
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    bob, alice = members(), members()
    hosts = HostService(ctx, Timeboxed(backend, 60))
    leases = LeaseService(ctx)
    # compute1 alone at first, so Bob's instance reservation lands there.
    hosts.create(ADMIN, "compute1", {"gpu": "a100"})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
    vm = lease_now(
        ctx, clock, bob.actor, "virtual:instance", name="bob-vm", length=2 * HOUR, **fields
    )
    start = vm.start_date
    rid = vm.reservations[0].id
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        server = boot(bob.conn, openstack_env["OSTEST_IMAGE_ID"], rid)
        assert cloud.compute.get_server(server.id).compute_host == "compute1"
        hosts.create(ADMIN, "compute2", {})
        whole = {
            "min": 1,
            "max": 1,
            "hypervisor_properties": "",
            "resource_properties": GPU,
            "reclaim": True,
        }
        hunt = leases.create(
            alice.actor,
            LeaseRequest(
                name="alice-hunt",
                start=None,
                end=start + HOUR,
                reservations=[ReservationRequest("physical:host", whole)],
                lease_type=LeaseType.BEST_EFFORT,
                deadline=start + 2 * HOUR,
            ),
        )
        assert hunt.status == "IN_PROGRESS"  # waiting: compute1 holds Bob's instance
        assert manager.serve_queue() == 1
        # Bob's real server now runs on compute2, with its reservation's capacity there.
        moved = cloud.compute.get_server(server.id)
        assert (moved.compute_host, moved.status) == ("compute2", "ACTIVE")
        assert aggregate(cloud, rid).hosts == ["compute2"]
        rc = resource_class(rid)
        assert (_inventory(cloud, "compute1", rc), _inventory(cloud, "compute2", rc)) == (0, 1)
        manager.run_due()
        assert leases.get(alice.actor, hunt.id).status == "ACTIVE"
        hunted = hunt.reservations[0].id
        assert aggregate(cloud, hunted).hosts == ["compute1"]
        assert leases.get(bob.actor, vm.id).status == "ACTIVE"
    finally:
        clock.set(start + 2 * HOUR)
        manager.run_due()
    assert aggregate(cloud, rid) is None
    assert cloud.compute.find_server(server.id, ignore_missing=True) is None
