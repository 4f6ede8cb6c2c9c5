"""Host healing on the real rig: a compute forced down in Nova is seen by the manager's host
monitor, which heals the active host reservation onto a spare compute (into the reservation's
aggregate, the failed host back in the freepool) within seconds; the compute forced up again is
reservable again. Proved with openstacksdk calls, not Climate's word."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kombu
from sqlalchemy import select

from climate import wire
from climate.backends.base import Timeboxed
from climate.backends.openstack.placement import resource_class
from climate.db.tables import Host, HostAllocation
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.manager.monitor import HostMonitor
from climate.manager.service import Manager
from climate.services.healing import HealingService
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN
from tests.openstack.conftest import aggregate, boot, lease_now

HOUR = dt.timedelta(hours=1)
SERVICES = "2.53"


def compute_service(cloud: Any, host: str) -> dict[str, Any]:
    response = cloud.compute.get(
        f"/os-services?binary=nova-compute&host={host}", microversion=SERVICES
    )
    response.raise_for_status()
    (service,) = response.json()["services"]
    return dict(service)


def force_down(cloud: Any, host: str, forced: bool) -> None:
    service = compute_service(cloud, host)
    response = cloud.compute.put(
        f"/os-services/{service['id']}", json={"forced_down": forced}, microversion=SERVICES
    )
    response.raise_for_status()


@contextmanager
def forced_down(cloud: Any, host: str) -> Iterator[None]:
    """``host``'s nova-compute forced down; forced up again whatever happens."""
    force_down(cloud, host, True)
    try:
        yield
    finally:
        force_down(cloud, host, False)


def wait_for(check: Any, seconds: float) -> float:
    """Seconds until ``check()`` is true; fails after ``seconds``."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < seconds, "not within the bound"
        time.sleep(0.05)
    return time.monotonic() - began


def test_a_compute_forced_down_heals_its_lease_onto_a_spare(
    climate: Any, cloud: Any, lessee: tuple[Actor, Any], clock: ManualClock
) -> None:
    ctx, backend = climate
    ctx = dataclasses.replace(
        ctx, settings=ctx.settings.model_copy(update={"nova_poll_seconds": 1})
    )
    actor, _ = lessee
    timeboxed = Timeboxed(backend, 60)
    hosts = HostService(ctx, timeboxed)
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    leases = LeaseService(ctx)
    lease = lease_now(ctx, clock, actor, name="heals")
    start = lease.start_date
    (reservation,) = lease.reservations
    manager = Manager(ctx, backend)
    manager.run_due()
    assert leases.get(actor, lease.id).status == "ACTIVE"
    (failing,) = aggregate(cloud, reservation.id).hosts
    spare = "compute2" if failing == "compute1" else "compute1"
    freepool = ctx.settings.freepool_name

    monitor = HostMonitor(ctx, timeboxed)
    monitor.start()
    try:
        with forced_down(cloud, failing):
            wait_for(lambda: aggregate(cloud, reservation.id).hosts == [spare], 15)
            assert failing in aggregate(cloud, freepool).hosts
            assert spare not in (aggregate(cloud, freepool).hosts or [])
            # Nova is changed inside the healing transaction, just before it commits.
            down_id = _host_id(ctx, failing)
            wait_for(lambda: hosts.get(ADMIN, str(down_id)).health == "down", 5)
            with ctx.db.reader() as session:
                down = session.scalars(select(Host).where(Host.service_name == failing)).one()
                assert (down.health, down.health_reason) == ("down", "nova: forced down")
                held = session.scalars(
                    select(HostAllocation.host_id).where(
                        HostAllocation.reservation_id == reservation.id
                    )
                ).all()
                assert [session.get(Host, h).service_name for h in held] == [spare]  # type: ignore[union-attr]
            shown = leases.get(actor, lease.id)
            assert shown.status == "ACTIVE" and not shown.degraded
        # Forced up: reservable again (the monitor wrote the down, so it writes the up).
        wait_for(lambda: hosts.get(ADMIN, str(down.id)).health == "up", 10)
    finally:
        monitor.stop()
    clock.set(start + HOUR)
    manager.run_due()
    assert leases.get(actor, lease.id).status == "TERMINATED"
    assert aggregate(cloud, reservation.id) is None
    assert {"compute1", "compute2"} <= set(aggregate(cloud, freepool).hosts)


def test_a_host_an_operator_marked_down_stays_down(
    climate: Any, cloud: Any, clock: ManualClock
) -> None:
    ctx, backend = climate
    timeboxed = Timeboxed(backend, 60)
    host = HostService(ctx, timeboxed).create(ADMIN, "compute1", {})
    HealingService(ctx, timeboxed).mark_down(ADMIN, str(host.id), "disk replaced")
    assert HostMonitor(ctx, timeboxed).poll() == []  # Nova says up; the operator's word stands
    shown = HostService(ctx, timeboxed).get(ADMIN, str(host.id))
    assert (shown.health, shown.health_reason) == ("down", "disk replaced")


def test_nova_s_service_update_notification_heals_without_waiting_for_a_poll(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    heard = {"nova_poll_seconds": 600, "nova_transport_url": openstack_env["TRANSPORT_URL"]}
    ctx = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=heard))
    backend.config = dataclasses.replace(
        backend.config, nova_transport_url=openstack_env["TRANSPORT_URL"]
    )
    actor, _ = lessee
    timeboxed = Timeboxed(backend, 60)
    hosts = HostService(ctx, timeboxed)
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    lease = lease_now(ctx, clock, actor, name="heard")
    start = lease.start_date
    (reservation,) = lease.reservations
    manager = Manager(ctx, backend)
    manager.run_due()
    (failing,) = aggregate(cloud, reservation.id).hosts
    spare = "compute2" if failing == "compute1" else "compute1"
    monitor = HostMonitor(ctx, timeboxed)
    monitor.start()  # polls once now, then not for 600 s: only a notification wakes it
    try:
        time.sleep(1)  # the first poll done and the listener consuming
        with forced_down(cloud, failing):
            wait_for(lambda: aggregate(cloud, reservation.id).hosts == [spare], 10)
        wait_for(lambda: hosts.get(ADMIN, str(_host_id(ctx, failing))).health == "up", 10)
    finally:
        monitor.stop()
        url = openstack_env["TRANSPORT_URL"].replace("rabbit://", "amqp://", 1)
        with kombu.Connection(url) as bus:
            bus.channel().queue_delete("climate")  # the listener pool's queue, left on purpose
    clock.set(start + HOUR)
    manager.run_due()
    assert aggregate(cloud, reservation.id) is None


def _host_id(ctx: Any, name: str) -> int:
    with ctx.db.reader() as session:
        return session.scalars(select(Host.id).where(Host.service_name == name)).one()


def _inventory(cloud: Any, host: str, rc: str) -> int:
    """The total of ``rc`` on ``blazar_<host>`` in Placement (0: none)."""
    found = cloud.placement.get(
        f"/resource_providers?name=blazar_{host}", microversion="1.29"
    ).json()["resource_providers"]
    if not found:
        return 0
    response = cloud.placement.get(
        f"/resource_providers/{found[0]['uuid']}/inventories/{rc}",
        microversion="1.29",
        raise_exc=False,
    )
    return int(response.json()["total"]) if response.status_code == 200 else 0


def test_a_compute_forced_down_heals_its_instance_reservation_onto_a_spare(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    """Blazar's instance heal: the spare joins the reservation's aggregate with the reserved
    Placement inventory on its ``blazar_<host>`` provider, the failed compute leaves the
    aggregate, and the lessee's next server of the flavor boots on the spare."""
    ctx, backend = climate
    ctx = dataclasses.replace(
        ctx, settings=ctx.settings.model_copy(update={"nova_poll_seconds": 1})
    )
    actor, conn = lessee
    timeboxed = Timeboxed(backend, 60)
    hosts = HostService(ctx, timeboxed)
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    leases = LeaseService(ctx)
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="heals-instances", **fields)
    start = lease.start_date
    rid = lease.reservations[0].id
    rc = resource_class(rid)
    image = openstack_env["OSTEST_IMAGE_ID"]
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        assert leases.get(actor, lease.id).status == "ACTIVE"
        (failing,) = aggregate(cloud, rid).hosts
        spare = "compute2" if failing == "compute1" else "compute1"
        first = boot(conn, image, rid)
        assert cloud.compute.get_server(first.id).compute_host == failing
        monitor = HostMonitor(ctx, timeboxed)
        monitor.start()
        try:
            with forced_down(cloud, failing):
                wait_for(lambda: aggregate(cloud, rid).hosts == [spare], 15)
                assert _inventory(cloud, spare, rc) == 1
                second = boot(conn, image, rid)
                assert cloud.compute.get_server(second.id).compute_host == spare
                shown = leases.get(actor, lease.id)
                assert not shown.degraded and shown.reservations[0].resources_changed
                spare_id = str(_host_id(ctx, spare))
                assert wire.reservation(shown.reservations[0])["hosts"] == [
                    {"host_id": spare_id, "count": 1}
                ]
            wait_for(lambda: hosts.get(ADMIN, str(_host_id(ctx, failing))).health == "up", 10)
        finally:
            monitor.stop()
    finally:
        clock.set(start + HOUR)
        manager.run_due()
    assert leases.get(actor, lease.id).status == "TERMINATED"
    assert aggregate(cloud, rid) is None
    assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
    assert _inventory(cloud, failing, rc) == _inventory(cloud, spare, rc) == 0
