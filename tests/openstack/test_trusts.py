"""Blazar's trusts on the rig: with ``auth = "keystone"`` an instance reservation's lease carries a
Keystone trust from the lessee to the service user, its server group is made in the lessee's
project through it (so the lessee boots with the ``group`` hint, as Blazar's docs say), and the
trust is gone once the lease has ended. A token Keystone will not make a trust from leaves the
lease as it would be without Keystone: the group in the service user's project. Proved with
openstacksdk calls as the lessee and the admin."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from climate.backends.base import Timeboxed
from climate.config import Settings
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.admission import AdmissionRefused
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN
from tests.openstack.conftest import Member, boot, empty_freepool, lease_now, rig_settings
from tests.openstack.test_full_stack import token

HOUR = dt.timedelta(hours=1)
FIELDS = {"amount": 2, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": True}


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


@pytest.fixture
def keystone_climate(
    openstack_env: dict[str, str], settings: Settings, db: Database, clock: ManualClock
) -> Iterator[tuple[ServiceContext, Any]]:
    """Climate's services with the openstack backend and ``auth = "keystone"``."""
    from climate.backends.openstack import OpenStackBackend

    merged = {
        **rig_settings(openstack_env).model_dump(exclude_unset=True),
        "auth": "keystone",
        "backend_timeout_seconds": 60.0,
    }
    ctx = build_context(settings.model_copy(update=merged), db, clock)
    assert ctx.trusts is not None
    backend = OpenStackBackend.from_settings(ctx.settings)
    hosts = HostService(ctx, Timeboxed(backend, 60))
    for name in ("compute1", "compute2"):
        hosts.create(ADMIN, name, {})
    yield ctx, backend
    empty_freepool(backend.conn, ctx.settings.freepool_name)


def with_token(env: dict[str, str], member: Member) -> Actor:
    """``member``'s actor carrying a real Keystone token of theirs, as the API makes it."""
    member_token = token(env["OS_AUTH_URL"], member.name, member.password, member.project_name)
    return dataclasses.replace(member.actor, token=member_token)


def as_admin(env: dict[str, str], path: str, **params: str) -> httpx.Response:
    """The rig admin's ``GET`` of Keystone's ``path``."""
    admin = token(
        env["OS_AUTH_URL"], env["OS_USERNAME"], env["OS_PASSWORD"], env["OS_PROJECT_NAME"]
    )
    return httpx.get(f"{env['OS_AUTH_URL']}{path}", params=params, headers={"X-Auth-Token": admin})


def trust_shown(env: dict[str, str], trust_id: str) -> int:
    """The status of the admin's ``GET /v3/OS-TRUST/trusts/<id>``."""
    return as_admin(env, f"/OS-TRUST/trusts/{trust_id}").status_code


def test_the_lessee_boots_into_its_reservations_server_group(
    keystone_climate: tuple[ServiceContext, Any],
    cloud: Any,
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = keystone_climate
    member = members()
    actor = with_token(openstack_env, member)
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="trusted", **FIELDS)
    trust_id = lease.trust_id
    assert trust_id is not None
    assert trust_shown(openstack_env, trust_id) == 200
    rid = lease.reservations[0].id
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        (reservation,) = LeaseService(ctx).get(actor, lease.id).reservations
        group = cloud.compute.get_server_group(reservation.params["server_group_id"])
        assert group.project_id == member.actor.project_id
        assert group.policy == "affinity"
        image = openstack_env["OSTEST_IMAGE_ID"]
        servers = [
            boot(member.conn, image, rid, scheduler_hints={"group": group.id}) for _ in range(2)
        ]
        placed = {cloud.compute.get_server(s.id).compute_host for s in servers}
        assert len(placed) == 1
        assert set(member.conn.compute.get_server_group(group.id).member_ids) == {
            s.id for s in servers
        }
    finally:
        clock.set(lease.start_date + HOUR)
        manager.run_due()
    assert cloud.compute.find_server_group(group.id, ignore_missing=True) is None
    assert trust_shown(openstack_env, trust_id) == 404


def test_a_token_keystone_will_not_trust_leaves_the_group_with_the_service_user(
    keystone_climate: tuple[ServiceContext, Any],
    cloud: Any,
    members: Callable[[], Member],
    clock: ManualClock,
) -> None:
    ctx, backend = keystone_climate
    member = members()
    actor = dataclasses.replace(member.actor, token="not-a-keystone-token")
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="untrusted", **FIELDS)
    assert lease.trust_id is None
    manager = Manager(ctx, backend)
    try:
        manager.run_due()
        (reservation,) = LeaseService(ctx).get(actor, lease.id).reservations
        group = cloud.compute.get_server_group(reservation.params["server_group_id"])
        assert group.project_id != member.actor.project_id
    finally:
        clock.set(lease.start_date + HOUR)
        manager.run_due()


def test_a_host_lease_needs_no_trust(
    keystone_climate: tuple[ServiceContext, Any],
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = keystone_climate
    member = members()
    actor = with_token(openstack_env, member)
    lease = lease_now(ctx, clock, actor, name="hosts-only")
    assert lease.trust_id is None
    LeaseService(ctx).delete(actor, lease.id)
    Manager(ctx, backend).run_due()


def test_a_refused_lease_leaves_no_trust_behind(
    keystone_climate: tuple[ServiceContext, Any],
    members: Callable[[], Member],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, _backend = keystone_climate
    member = members()
    actor = with_token(openstack_env, member)
    too_many = FIELDS | {"amount": 40, "affinity": None}  # two computes of 16 vCPUs
    with pytest.raises(AdmissionRefused):
        lease_now(ctx, clock, actor, "virtual:instance", name="too-big", **too_many)
    trusts = as_admin(openstack_env, "/OS-TRUST/trusts", trustor_user_id=member.actor.user_id)
    assert trusts.status_code == 200, trusts.text
    assert trusts.json()["trusts"] == []
