"""Idle reclamation's sign of use on the real rig: a running host lease reads idle while nothing
runs on its host, in use once the lessee's server is ACTIVE there, and idle again once it is
gone; an instance lease likewise with a server of its flavor (``InspectUsage``,
backends/openstack/servers.py). Proved with servers booted through Nova, not Climate's word."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from climate.backends.base import Handover, InspectUsage, Timeboxed, Usage
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.idle import IdleService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN
from tests.openstack.conftest import boot, lease_now

HOUR = dt.timedelta(hours=1)
WATCHING = {"idle_reclaim": True, "idle_warning_hours": 1.0, "idle_release_hours": 2.0}


def test_a_host_lease_is_in_use_while_a_server_runs_on_its_host(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    rig, backend = climate
    ctx = build_context(rig.settings.model_copy(update=WATCHING), rig.db, clock)
    actor, lessee_conn = lessee
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute3", {})
    lease = lease_now(ctx, clock, actor, name="idle-or-not", end_policy="delete")
    start = lease.start_date
    (reservation,) = lease.reservations
    handover = Handover(lease.id, reservation.id, actor.project_id, "physical:host", (), start)
    manager = Manager(ctx, backend)
    idle = IdleService(ctx, Timeboxed(backend, 60))
    try:
        manager.run_due()
        shown = LeaseService(ctx).get(actor, lease.id)
        assert shown.status == "ACTIVE", shown.status_reason
        assert backend.handle([InspectUsage((handover,))]) == [Usage({reservation.id: False})]
        assert idle.run().in_use == ()

        flavor = cloud.compute.create_flavor(
            name=f"climate-{uuid.uuid4().hex[:6]}", vcpus=1, ram=256, disk=1
        )
        try:
            server = boot(
                lessee_conn,
                openstack_env["OSTEST_IMAGE_ID"],
                flavor.id,
                scheduler_hints={"reservation": reservation.id},
            )
            assert cloud.compute.get_server(server.id).compute_host == "compute3"
            assert backend.handle([InspectUsage((handover,))]) == [Usage({reservation.id: True})]
            assert idle.run().in_use == (lease.id,)
            cloud.compute.delete_server(server)
            cloud.compute.wait_for_delete(server, wait=60)
            assert backend.handle([InspectUsage((handover,))]) == [Usage({reservation.id: False})]
        finally:
            cloud.compute.delete_flavor(flavor)
    finally:
        clock.set(start + HOUR)
        manager.run_due()


def test_an_instance_lease_is_in_use_while_a_server_of_its_flavor_runs(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    rig, backend = climate
    ctx = build_context(rig.settings.model_copy(update=WATCHING), rig.db, clock)
    actor, lessee_conn = lessee
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute2", {})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="idle-instances", **fields)
    start = lease.start_date
    (reservation,) = lease.reservations
    rid = reservation.id
    handover = Handover(lease.id, rid, actor.project_id, "virtual:instance", (), start)
    manager = Manager(ctx, backend)
    idle = IdleService(ctx, Timeboxed(backend, 60))
    try:
        manager.run_due()
        assert LeaseService(ctx).get(actor, lease.id).status == "ACTIVE"
        assert backend.handle([InspectUsage((handover,))]) == [Usage({rid: False})]
        server = boot(lessee_conn, openstack_env["OSTEST_IMAGE_ID"], rid)
        assert backend.handle([InspectUsage((handover,))]) == [Usage({rid: True})]
        assert idle.run().in_use == (lease.id,)
        lessee_conn.compute.stop_server(server)
        lessee_conn.compute.wait_for_server(server, status="SHUTOFF", wait=60)
        assert backend.handle([InspectUsage((handover,))]) == [Usage({rid: False})]
    finally:
        clock.set(start + HOUR)
        manager.run_due()
