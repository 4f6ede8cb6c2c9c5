"""Blazar's behaviours in Nova with real servers (the issue's "Done when"): another project's boot
with the ``reservation`` hint refused by BlazarFilter, an instance reservation's flavor usable by
its project only and only during its lease, affinity and anti-affinity honoured by Nova, each end
policy applied to the servers left on the hosts. Proved with openstacksdk calls as the lessee,
another project and the admin, not with Climate's word. SQLite only: the database is not what
these test, and each costs the shared rig seconds."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openstack
import pytest

from climate.backends.base import Timeboxed
from climate.backends.openstack.placement import resource_class
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.reservation_actions import ReservationActionService
from tests.conftest import ADMIN
from tests.openstack.conftest import Member, aggregate, boot, lease_now

HOUR = dt.timedelta(hours=1)
Climate = tuple[ServiceContext, Any]


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def started_now(
    ctx: ServiceContext, clock: ManualClock, actor: Actor, resource_type: str, **fields: Any
) -> tuple[str, str, dt.datetime]:
    """``lease_now``'s lease as (lease id, reservation id, start)."""
    lease = lease_now(ctx, clock, actor, resource_type, name="blazar-behaviour", **fields)
    return lease.id, lease.reservations[0].id, lease.start_date


def refused(boot_it: Callable[[], Any]) -> bool:
    """Whether Nova refuses the boot (an API error, or the server goes to ERROR: no valid
    host)."""
    try:
        boot_it()
    except openstack.exceptions.SDKException:
        return True
    return False


def test_another_projects_boot_with_the_hint_is_refused(
    climate: Climate,
    cloud: Any,
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    owner, other = members(), members()
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute3", {})
    lease_id, rid, start = started_now(ctx, clock, owner.actor, "physical:host")
    manager = Manager(ctx, backend)
    flavor = cloud.compute.create_flavor(name=f"climate-{rid[:8]}", vcpus=1, ram=256, disk=1)
    image = openstack_env["OSTEST_IMAGE_ID"]
    try:
        manager.run_due()
        assert aggregate(cloud, rid).hosts == ["compute3"]
        hint = {"reservation": rid}
        assert refused(lambda: boot(other.conn, image, flavor.id, scheduler_hints=hint))
        mine = boot(owner.conn, image, flavor.id, scheduler_hints=hint)
        assert cloud.compute.get_server(mine.id).compute_host == "compute3"
    finally:
        clock.set(start + HOUR)
        manager.run_due()
        cloud.compute.delete_flavor(flavor)
    assert LeaseService(ctx).get(owner.actor, lease_id).status == "TERMINATED"


def test_an_instance_flavor_serves_its_project_only_and_only_during_the_lease(
    climate: Climate,
    cloud: Any,
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    owner, other = members(), members()
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute2", {})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
    lease_id, rid, start = started_now(ctx, clock, owner.actor, "virtual:instance", **fields)
    image = openstack_env["OSTEST_IMAGE_ID"]
    manager = Manager(ctx, backend)
    try:
        assert refused(lambda: boot(owner.conn, image, rid))  # before the lease: no flavor
        manager.run_due()
        assert LeaseService(ctx).get(owner.actor, lease_id).status == "ACTIVE"

        assert other.conn.compute.find_flavor(rid, ignore_missing=True) is None
        assert refused(lambda: boot(other.conn, image, rid))
        server = boot(owner.conn, image, rid)
        assert cloud.compute.get_server(server.id).compute_host == "compute2"
        # One instance reserved: Placement has no room for a second one.
        assert refused(lambda: boot(owner.conn, image, rid))

        clock.set(start + HOUR)
        manager.run_due()
        assert LeaseService(ctx).get(owner.actor, lease_id).status == "TERMINATED"
        assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
        assert cloud.compute.find_server(server.id, ignore_missing=True) is None
        assert refused(lambda: boot(owner.conn, image, rid))
    finally:
        clock.set(start + HOUR)
        manager.run_due()


@pytest.mark.parametrize("affinity", [True, False], ids=["affinity", "anti-affinity"])
def test_affinity_is_honoured_by_nova(
    climate: Climate,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
    affinity: bool,
) -> None:
    ctx, backend = climate
    actor, conn = lessee
    hosts = HostService(ctx, Timeboxed(backend, 60))
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    fields = {"amount": 2, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": affinity}
    lease_id, rid, start = started_now(ctx, clock, actor, "virtual:instance", **fields)
    image = openstack_env["OSTEST_IMAGE_ID"]
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        (reservation,) = LeaseService(ctx).get(actor, lease_id).reservations
        group = reservation.params["server_group_id"]
        policy = "affinity" if affinity else "anti-affinity"
        assert cloud.compute.get_server_group(group).policy == policy
        # The group lives in Climate's service project, where the lessee cannot name it (Nova:
        # 400 "Instance group ... could not be found"): Placement holds the rule, the reserved
        # inventory lying on one host (affinity) or one per host (anti-affinity).
        servers = [boot(conn, image, rid) for _ in range(2)]
        placed = {cloud.compute.get_server(s.id).compute_host for s in servers}
        assert len(placed) == (1 if affinity else 2)
        assert placed <= {"compute1", "compute2"}
    finally:
        clock.set(start + HOUR)
        manager.run_due()
    assert cloud.compute.find_server_group(group, ignore_missing=True) is None


def images_of(openstack_env: dict[str, str], server_id: str) -> list[dict[str, Any]]:
    """Images the image service (the rig's stub) holds snapshots of ``server_id`` in."""
    url = f"http://127.0.0.1:{openstack_env['IMAGE_PORT']}/v2/images"
    return [i for i in httpx.get(url).json()["images"] if i.get("instance_uuid") == server_id]


@pytest.mark.parametrize("policy", ["snapshot", "suspend", "keep-until-ack"])
def test_the_end_policy_is_applied_to_servers_left_on_the_hosts(
    climate: Climate,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
    policy: str,
) -> None:
    ctx, backend = climate
    actor, conn = lessee
    if policy in ("snapshot", "suspend"):
        # Nova shares the image of another project's server (a snapshot, or the image a shelve
        # makes) with its owner through Glance's image members API, which the rig's image stub
        # lacks (Nova answers 500): the lessee here is the service user's own project.
        actor = Actor(cloud.current_user_id, cloud.current_project_id, frozenset({"member"}))
        conn = cloud
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute3", {})
    if policy == "snapshot":  # offered for whole hosts; suspend and keep for instances
        lease_id, rid, start = started_now(ctx, clock, actor, "physical:host", end_policy=policy)
    else:
        fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
        fields["end_policy"] = policy
        lease_id, rid, start = started_now(ctx, clock, actor, "virtual:instance", **fields)
    manager = Manager(ctx, backend)
    flavor = cloud.compute.create_flavor(name=f"climate-{rid[:8]}", vcpus=1, ram=256, disk=1)
    image = openstack_env["OSTEST_IMAGE_ID"]
    server_id = ""
    try:
        manager.run_due()
        if policy == "snapshot":
            server = boot(conn, image, flavor.id, scheduler_hints={"reservation": rid})
        else:
            server = boot(conn, image, rid)
        server_id = server.id
        assert cloud.compute.get_server(server.id).compute_host == "compute3"
        clock.set(start + HOUR)
        manager.run_due()
        assert LeaseService(ctx).get(actor, lease_id).status == "TERMINATED"
        assert aggregate(cloud, rid) is None
        left = cloud.compute.find_server(server.id, ignore_missing=True)
        if policy == "snapshot":
            assert "compute3" in aggregate(cloud, ctx.settings.freepool_name).hosts
            (snapshot,) = images_of(openstack_env, server.id)
            assert snapshot["name"] == f"reservation:{rid}:{server.id}"
            assert left is None
        elif policy == "suspend":
            assert left.status == "SHELVED_OFFLOADED"  # off the host, resumable elsewhere
            assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
        else:
            assert left.status == "SHUTOFF"
            assert conn.compute.find_flavor(rid, ignore_missing=True) is None  # no more boots
            ReservationActionService(ctx, backend).acknowledge(actor, lease_id, rid)
            assert cloud.compute.find_server(server.id, ignore_missing=True) is None
            assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
            gone = cloud.placement.get(f"/resource_classes/{resource_class(rid)}")
            assert gone.status_code == 404
    finally:
        clock.set(start + HOUR)
        manager.run_due()
        cloud.compute.delete_flavor(flavor)
        if server_id:
            cloud.compute.delete_server(server_id, ignore_missing=True)
        for made in images_of(openstack_env, server_id) if server_id else []:
            httpx.delete(f"http://127.0.0.1:{openstack_env['IMAGE_PORT']}/v2/images/{made['id']}")
