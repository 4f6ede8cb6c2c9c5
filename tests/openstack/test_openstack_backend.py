"""Climate with the openstack backend against the real rig (Keystone, Nova with BlazarFilter,
Placement): host enrolment from Nova, a host lease moving its host into the reservation's
aggregate and back, the lessee's boot with the ``reservation`` hint landing there and a boot
without it refused, the end policy applied, an instance reservation's flavor and inventory, and
a missing setting named at start-up. Proved with openstacksdk calls, not Climate's word."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
import uuid
from typing import Any

import openstack
import pytest

import climate.backends.openstack as openstack_backend
from climate import wire
from climate.backends.base import Handover, Timeboxed
from climate.backends.openstack import OpenStackBackend
from climate.backends.openstack.placement import resource_class
from climate.backends.openstack.servers import servers_of
from climate.config import load_settings
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.domain.requests import LeaseChanges, ReservationRequest
from climate.errors import Conflict, InvalidInput
from climate.manager.service import Manager
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService
from climate.services.reservation_actions import ReservationActionService
from tests.conftest import ADMIN
from tests.openstack.conftest import HOST_FIELDS, aggregate, boot, lease_now, rig_settings

HOUR = dt.timedelta(hours=1)


def test_unknown_host_is_refused_and_nothing_written(climate: Any) -> None:
    ctx, backend = climate
    hosts = HostService(ctx, Timeboxed(backend, 60))
    with pytest.raises(InvalidInput, match="name: Nova has no hypervisor named 'compute99'"):
        hosts.create(ADMIN, "compute99", {})
    assert list(hosts.list_all(ADMIN)) == []


def test_a_host_with_servers_is_refused_as_blazar_refuses_it(
    climate: Any, cloud: Any, openstack_env: dict[str, str]
) -> None:
    ctx, backend = climate
    hosts = HostService(ctx, Timeboxed(backend, 60))
    flavor = cloud.compute.create_flavor(
        name=f"climate-{uuid.uuid4().hex[:6]}", vcpus=1, ram=256, disk=1
    )
    server = boot(
        cloud, openstack_env["OSTEST_IMAGE_ID"], flavor.id, availability_zone="nova:compute2"
    )
    try:
        with pytest.raises(
            Conflict, match=rf"name: Servers \[{server.id}\] found for host compute2"
        ):
            hosts.create(ADMIN, "compute2", {})
        assert list(hosts.list_all(ADMIN)) == []
        assert aggregate(cloud, ctx.settings.freepool_name) is None
    finally:
        cloud.compute.delete_server(server)
        cloud.compute.wait_for_delete(server, wait=60)
        cloud.compute.delete_flavor(flavor)


def test_a_host_with_servers_is_not_deleted_as_blazar_refuses_it(
    climate: Any, cloud: Any, openstack_env: dict[str, str]
) -> None:
    """A server booted on an enrolled host by forcing it there (``nova:<host>`` skips the
    scheduler's filters, BlazarFilter too, as an admin may): the host is not deleted (409
    naming the server) and stays in the freepool; once the server is gone it is deleted."""
    ctx, backend = climate
    hosts = HostService(ctx, Timeboxed(backend, 60))
    host = hosts.create(ADMIN, "compute2", {})
    flavor = cloud.compute.create_flavor(
        name=f"climate-{uuid.uuid4().hex[:6]}", vcpus=1, ram=256, disk=1
    )
    server = boot(
        cloud, openstack_env["OSTEST_IMAGE_ID"], flavor.id, availability_zone="nova:compute2"
    )
    try:
        assert cloud.compute.get_server(server.id).compute_host == "compute2"
        with pytest.raises(Conflict, match=rf"^Servers \[{server.id}\] found for host compute2$"):
            hosts.delete(ADMIN, str(host.id))
        assert [h.id for h in hosts.list_all(ADMIN)] == [host.id]
        assert aggregate(cloud, ctx.settings.freepool_name).hosts == ["compute2"]
    finally:
        cloud.compute.delete_server(server)
        cloud.compute.wait_for_delete(server, wait=60)
        cloud.compute.delete_flavor(flavor)
    hosts.delete(ADMIN, str(host.id))
    assert list(hosts.list_all(ADMIN)) == []
    assert "compute2" not in (aggregate(cloud, ctx.settings.freepool_name).hosts or [])


def test_a_running_host_lease_that_grows_gets_its_new_host_in_its_aggregate(
    climate: Any, lessee: tuple[Actor, Any], clock: ManualClock
) -> None:
    ctx, backend = climate
    actor, _ = lessee
    hosts = HostService(ctx, Timeboxed(backend, 60))
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    lease = lease_now(ctx, clock, actor, name="grows")
    (reservation,) = lease.reservations
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        assert len(aggregate(backend.conn, reservation.id).hosts) == 1
        clock.advance(dt.timedelta(minutes=10))
        grow = ReservationRequest(None, {"min": 2, "max": 2}, reservation.id)
        ReservationActionService(ctx, backend).update_lease(
            actor, lease.id, LeaseChanges(reservations=[grow])
        )
        assert sorted(aggregate(backend.conn, reservation.id).hosts) == ["compute1", "compute2"]
        assert aggregate(backend.conn, ctx.settings.freepool_name).hosts == []
        # The host added is held from when it was handed over, not from the lease's start.
        held = LeaseService(ctx).get(actor, lease.id).reservations[0].allocations
        assert sorted(a.start_date for a in held) == [lease.start_date, clock.now()]
    finally:
        clock.set(lease.end_date)
        manager.run_due()


def test_a_running_instance_reservation_that_grows_holds_its_new_slot_from_then_on(
    climate: Any, cloud: Any, lessee: tuple[Actor, Any], clock: ManualClock
) -> None:
    """amount 1 -> 2 on a running anti-affinity reservation: the second host joins its
    aggregate with the reservation's inventory, and its allocation starts when it was added."""
    ctx, backend = climate
    actor, _ = lessee
    hosts = HostService(ctx, Timeboxed(backend, 60))
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": False}
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="grows", **fields)
    rid = lease.reservations[0].id
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        assert len(aggregate(cloud, rid).hosts) == 1
        clock.advance(dt.timedelta(minutes=10))
        grow = ReservationRequest(None, {"amount": 2}, rid)
        ReservationActionService(ctx, backend).update_lease(
            actor, lease.id, LeaseChanges(reservations=[grow])
        )
        assert sorted(aggregate(cloud, rid).hosts) == ["compute1", "compute2"]
        shown = LeaseService(ctx).get(actor, lease.id).reservations[0]
        held = shown.instance_allocations
        assert sorted(a.start_date for a in held) == [lease.start_date, clock.now()]
        assert sorted(h["count"] for h in wire.reservation(shown)["hosts"]) == [1, 1]
    finally:
        clock.set(lease.end_date)
        manager.run_due()
    assert aggregate(cloud, rid) is None


def test_enrolment_reads_the_zone_and_cpu_info_a_blazar_lease_may_ask_for(
    climate: Any, lessee: tuple[Actor, Any], clock: ManualClock
) -> None:
    ctx, backend = climate
    host = HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute1", {})
    shown = wire.host(host)
    assert shown["availability_zone"] == "nova"
    assert json.loads(shown["cpu_info"])["arch"] == "x86_64"
    asked = {"hypervisor_properties": '["==", "$availability_zone", "nova"]'}
    start = clock.now() + HOUR  # a future lease: nothing moves in Nova
    wanted = ReservationRequest("physical:host", HOST_FIELDS | asked)
    lease = LeaseService(ctx).create(
        lessee[0], LeaseRequest("zoned", start, start + HOUR, reservations=[wanted])
    )
    assert [a.host_id for a in lease.reservations[0].allocations] == [host.id]


def test_no_server_of_an_instance_flavor_is_booted_while_its_lease_ends(
    climate: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx, backend = climate
    actor, lessee_conn = lessee
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute1", {})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1}
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="racing", **fields)
    rid = lease.reservations[0].id
    manager = Manager(ctx, backend)
    manager.run_due()
    booted: list[Any] = []

    def listed_then_booted(conn: Any, h: Handover) -> list[Any]:
        """The end's listing of the flavor's servers, and the lessee's boot right after it."""
        found = servers_of(conn, h)
        if not booted:
            booted.append(None)
            with contextlib.suppress(openstack.exceptions.SDKException):  # refused
                booted.append(boot(lessee_conn, openstack_env["OSTEST_IMAGE_ID"], rid))
        return found

    monkeypatch.setattr(openstack_backend, "servers_of", listed_then_booted)
    clock.set(lease.end_date)
    manager.run_due()
    assert LeaseService(ctx).get(actor, lease.id).status == "TERMINATED"
    assert booted == [None]  # the lessee could no longer boot the flavor


def test_a_deleted_host_keeps_its_blazar_provider_and_boots_servers(
    climate: Any, cloud: Any, openstack_env: dict[str, str]
) -> None:
    """Blazar deletes ``blazar_<host>`` with the host; nova-compute, which caches its provider
    tree, then fails each build there ("Resource provider ... not found") until it refreshes
    the tree, up to 300 s later."""
    ctx, backend = climate
    hosts = HostService(ctx, Timeboxed(backend, 60))
    host = hosts.create(ADMIN, "compute3", {})
    backend.placement.child("compute3")  # as an instance reservation's start makes it
    hosts.delete(ADMIN, str(host.id))
    flavor = cloud.compute.create_flavor(
        name=f"climate-{uuid.uuid4().hex[:6]}", vcpus=1, ram=256, disk=1
    )
    try:
        server = boot(
            cloud, openstack_env["OSTEST_IMAGE_ID"], flavor.id, availability_zone="nova:compute3"
        )
        cloud.compute.delete_server(server)
        cloud.compute.wait_for_delete(server, wait=60)
    finally:
        cloud.compute.delete_flavor(flavor)


def test_a_deleted_host_leaves_the_freepool(climate: Any, cloud: Any) -> None:
    ctx, backend = climate
    hosts = HostService(ctx, Timeboxed(backend, 60))
    host = hosts.create(ADMIN, "compute1", {})
    assert "compute1" in aggregate(cloud, ctx.settings.freepool_name).hosts
    hosts.delete(ADMIN, str(host.id))
    assert "compute1" not in (aggregate(cloud, ctx.settings.freepool_name).hosts or [])
    assert list(hosts.list_all(ADMIN)) == []


def test_a_host_lease_moves_its_host_and_the_lessee_boots_there(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    actor, lessee_conn = lessee
    host = HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute3", {})
    assert (host.vcpus, host.memory_mb, host.service_name) == (16, 32768, "compute3")
    assert "compute3" in aggregate(cloud, ctx.settings.freepool_name).hosts

    leases = LeaseService(ctx)
    lease = lease_now(ctx, clock, actor, name="on-nova", end_policy="delete")
    start = lease.start_date
    (reservation,) = lease.reservations
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        shown = leases.get(actor, lease.id)
        assert shown.status == "ACTIVE", shown.status_reason
        assert [r.status for r in shown.reservations] == ["active"]
        pool = aggregate(cloud, reservation.id)
        assert pool.hosts == ["compute3"]
        assert pool.availability_zone == f"blazar_{reservation.id}"
        assert pool.metadata["blazar:owner"] == actor.project_id
        assert pool.metadata[actor.project_id] == "blazar:project"
        assert "compute3" not in (aggregate(cloud, ctx.settings.freepool_name).hosts or [])

        image = openstack_env["OSTEST_IMAGE_ID"]
        flavor = cloud.compute.create_flavor(
            name=f"climate-{uuid.uuid4().hex[:6]}", vcpus=1, ram=256, disk=1
        )
        try:
            hinted = boot(
                lessee_conn, image, flavor.id, scheduler_hints={"reservation": reservation.id}
            )
            assert cloud.compute.get_server(hinted.id).compute_host == "compute3"
            # Without the hint BlazarFilter keeps it off the reserved host (another host
            # outside every Blazar pool may take it, or none: "No valid host").
            try:
                unhinted = boot(lessee_conn, image, flavor.id)
            except openstack.exceptions.ResourceFailure:
                pass
            else:
                assert cloud.compute.get_server(unhinted.id).compute_host != "compute3"
                cloud.compute.delete_server(unhinted)

            clock.set(start + HOUR)
            manager.run_due()
        finally:
            cloud.compute.delete_flavor(flavor)
        shown = leases.get(actor, lease.id)
        assert shown.status == "TERMINATED"
        assert [r.status for r in shown.reservations] == ["deleted"]
        assert aggregate(cloud, reservation.id) is None
        assert "compute3" in aggregate(cloud, ctx.settings.freepool_name).hosts
        assert cloud.compute.find_server(hinted.id, ignore_missing=True) is None  # delete policy
    finally:
        clock.set(start + HOUR)
        manager.run_due()


def test_an_instance_reservation_makes_its_flavor_and_inventory(
    climate: Any, cloud: Any, lessee: tuple[Actor, Any], clock: ManualClock
) -> None:
    ctx, backend = climate
    actor, _ = lessee
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute2", {})
    fields = {"amount": 2, "vcpus": 1, "memory_mb": 512, "disk_gb": 1, "affinity": True}
    leases = LeaseService(ctx)
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="instances", **fields)
    start = lease.start_date
    (reservation,) = lease.reservations
    rid = reservation.id
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        assert leases.get(actor, lease.id).status == "ACTIVE"
        flavor = cloud.compute.get_flavor(rid)
        assert (flavor.name, flavor.is_public) == (f"reservation:{rid}", False)
        specs = cloud.compute.fetch_flavor_extra_specs(flavor).extra_specs
        assert specs["aggregate_instance_extra_specs:reservation"] == rid
        assert specs[f"resources:{resource_class(rid)}"] == "1"
        assert [a["tenant_id"] for a in cloud.compute.get_flavor_access(flavor)] == [
            actor.project_id
        ]
        pool = aggregate(cloud, rid)
        assert pool.metadata["reservation"] == rid
        assert pool.metadata["filter_tenant_id"] == actor.project_id
        group = cloud.compute.get_server_group(pool.metadata["affinity_id"])
        assert group.name == f"reservation:{rid}"
        assert specs["affinity_id"] == group.id
        child = cloud.placement.get(
            "/resource_providers?name=blazar_compute2", microversion="1.14"
        ).json()["resource_providers"][0]
        inventory = cloud.placement.get(
            f"/resource_providers/{child['uuid']}/inventories", microversion="1.14"
        ).json()["inventories"]
        assert inventory[resource_class(rid)]["total"] == 2

        clock.set(start + HOUR)
        manager.run_due()
        assert leases.get(actor, lease.id).status == "TERMINATED"
        assert aggregate(cloud, rid) is None
        assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
        classes = cloud.placement.get(f"/resource_classes/{resource_class(rid)}")
        assert classes.status_code == 404
    finally:
        clock.set(start + HOUR)
        manager.run_due()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"os_auth_url": ""}, "os_auth_url"),
        ({"os_password": ""}, "os_password"),
        ({"os_password": "wrong"}, "os_password"),
        ({"os_auth_url": "http://127.0.0.1:9/v3"}, "os_auth_url"),
    ],
)
def test_a_missing_or_wrong_setting_is_named_at_start_up(
    openstack_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, str],
    named: str,
) -> None:
    for key in list(os.environ):
        if key.startswith("OS_"):
            monkeypatch.delenv(key)
    settings = rig_settings(openstack_env).model_copy(update=change)
    began = time.monotonic()
    with pytest.raises(InvalidInput, match=f"^[^:]*\\b{named}\\b[^:]*: "):
        OpenStackBackend.from_settings(settings)
    assert time.monotonic() - began < 60


def test_os_variables_alone_configure_it(
    openstack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME"):
        monkeypatch.setenv(key, openstack_env[key])
    monkeypatch.setenv("OS_USER_DOMAIN_NAME", "Default")
    monkeypatch.setenv("OS_PROJECT_DOMAIN_NAME", "Default")
    monkeypatch.delenv("OS_CLIENT_CONFIG_FILE", raising=False)
    backend = OpenStackBackend.from_settings(load_settings(backend="openstack"))
    assert backend.config.credentials.auth["username"] == openstack_env["OS_USERNAME"]
