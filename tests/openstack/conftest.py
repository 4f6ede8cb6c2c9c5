"""The real OpenStack rig (../shared/openstack: Keystone, Nova, Placement on loopback), started once
per test run with Blazar's Nova filter. Tests here skip with one line when it cannot start, except
under ``CI=true`` (or ``OSTEST_REQUIRED=1``), where they fail. ``OSTEST_KEEP=1`` leaves it running
for the next run (which then starts in 0.1 s, seeing this run's data)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openstack
import pytest
from bench.openstack import admin_connection, aggregate
from sqlalchemy import select

from climate.config import Settings
from climate.db.engine import Database
from climate.db.tables import Lease, Reservation
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest

RIG = Path(os.environ.get("OSTEST_RIG", Path(__file__).resolve().parents[3] / "shared/openstack"))
BASE = os.environ.get("OSTEST_BASE", "/tmp/os-local")
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("OSTEST_REQUIRED") == "1"
ON_THE_RIG = (pytest.mark.rig, pytest.mark.xdist_group("openstack-rig"))
"""Every test driving the rig (all of this directory, and ``ON_THE_RIG`` elsewhere) runs after
the others, alone, in one process (``make test``): tests here stop Nova, Placement or the broker
and force computes down, and the rig's services time out under a loaded machine's other tests.
A plain ``pytest`` on two workers still keeps them on one (the rig is started once per worker)."""


def _unavailable(message: str) -> None:
    if REQUIRED:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def openstack_env() -> Iterator[dict[str, str]]:
    """Start the rig once; yield ``BASE/ostest.env`` as a dict (OS_AUTH_URL, NOVA_URL, ...)."""
    if not (RIG / "start.sh").is_file():
        _unavailable(f"OpenStack rig not found at {RIG} (set OSTEST_RIG)")
    if os.geteuid() != 0:
        _unavailable("the OpenStack rig needs root (apt-get, rabbitmq-server); skipping")
    env = dict(os.environ, BLAZAR_FILTER="1", NOVA_NOTIFICATIONS="messagingv2")
    try:
        proc = subprocess.run(
            [str(RIG / "start.sh"), BASE], capture_output=True, text=True, timeout=900, env=env
        )
    except subprocess.TimeoutExpired:
        subprocess.run([str(RIG / "stop.sh"), BASE], capture_output=True, check=False)
        _unavailable("the OpenStack rig's start.sh did not finish within 900 s")
        raise  # unreachable: _unavailable raises
    if proc.returncode != 0:
        _unavailable(
            f"the OpenStack rig's start.sh failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    lines = Path(BASE, "ostest.env").read_text().splitlines()
    yield dict(line.split("=", 1) for line in lines if "=" in line)
    if os.environ.get("OSTEST_KEEP") != "1":
        subprocess.run([str(RIG / "stop.sh"), BASE], capture_output=True, timeout=300, check=False)


# -- shared by the suites that drive Climate against the rig ------------------------------------


@pytest.fixture
def cloud(openstack_env: dict[str, str]) -> Any:
    os.environ.pop("OS_CLIENT_CONFIG_FILE", None)  # for the SDK connections tests make
    return admin_connection(openstack_env)


@dataclass
class Member:
    """A Keystone project with a member user: Climate's actor for it and its own connection."""

    actor: Actor
    conn: Any
    name: str
    password: str
    project_name: str


@pytest.fixture
def members(cloud: Any, openstack_env: dict[str, str]) -> Iterator[Callable[[], Member]]:
    """Makes projects with a member each; removes them (and their servers) at the end."""
    made: list[tuple[Any, Any]] = []

    def make() -> Member:
        tag = uuid.uuid4().hex[:8]
        project = cloud.identity.create_project(name=f"climate-lessee-{tag}", domain_id="default")
        user = cloud.identity.create_user(
            name=f"climate-lessee-{tag}", password="secret", domain_id="default"
        )
        made.append((project, user))
        cloud.identity.assign_project_role_to_user(
            project, user, cloud.identity.find_role("member")
        )
        conn = openstack.connect(
            auth={
                "auth_url": openstack_env["OS_AUTH_URL"],
                "username": user.name,
                "password": "secret",
                "project_id": project.id,
                "user_domain_name": "Default",
            },
            region_name="RegionOne",
            load_yaml_config=False,
            connect_retries=3,
        )
        actor = Actor(user.id, project.id, frozenset({"member"}))
        return Member(actor, conn, user.name, "secret", project.name)

    yield make
    for project, user in made:
        servers = list(cloud.compute.servers(all_projects=True, project_id=project.id))
        for server in servers:
            cloud.compute.delete_server(server)
        for server in servers:
            cloud.compute.wait_for_delete(server, wait=60)
        cloud.identity.delete_user(user)
        cloud.identity.delete_project(project)


@pytest.fixture
def lessee(members: Callable[[], Member]) -> tuple[Actor, Any]:
    member = members()
    return member.actor, member.conn


def rig_settings(env: dict[str, str], **changes: Any) -> Settings:
    """Settings of the openstack backend as the rig's admin, with a freepool of its own: the
    rig is shared, and BlazarFilter refuses unhinted boots on hosts left in ``freepool``."""
    return Settings(
        backend="openstack",
        os_auth_url=env["OS_AUTH_URL"],
        os_username=env["OS_USERNAME"],
        os_password=env["OS_PASSWORD"],
        os_project_name=env["OS_PROJECT_NAME"],
        os_user_domain_name="Default",
        os_project_domain_name="Default",
        os_region_name=env.get("OS_REGION_NAME", "RegionOne"),
        freepool_name=f"freepool-{uuid.uuid4().hex[:8]}",
        **changes,
    )


def empty_freepool(cloud: Any, name: str) -> None:
    """Hosts out of freepool ``name``, which is deleted: the rig as it was."""
    pool = aggregate(cloud, name)
    if pool is not None:
        for host in list(pool.hosts or []):
            pool = cloud.compute.remove_host_from_aggregate(pool, host)
        cloud.compute.delete_aggregate(pool)


@pytest.fixture
def climate(
    openstack_env: dict[str, str], settings: Settings, db: Database, clock: ManualClock
) -> Iterator[tuple[ServiceContext, Any]]:
    """Climate's services on ``db`` with the openstack backend, on a manual clock."""
    from climate.backends.openstack import OpenStackBackend

    merged = {
        **rig_settings(openstack_env).model_dump(exclude_unset=True),
        "backend_timeout_seconds": 60.0,
    }
    ctx = build_context(settings.model_copy(update=merged), db, clock)
    backend = OpenStackBackend.from_settings(ctx.settings)
    yield ctx, backend
    # A test that failed midway may leave a reservation's aggregate holding a host (in a
    # blazar_ zone, where it refuses every other aggregate): take it down.
    with db.reader() as session:
        made = set(session.scalars(select(Reservation.id)))
    for pool in list(backend.conn.compute.aggregates()):
        if pool.name in made:
            for host in list(pool.hosts or []):
                pool = backend.conn.compute.remove_host_from_aggregate(pool, host)
            backend.conn.compute.delete_aggregate(pool)
    empty_freepool(backend.conn, ctx.settings.freepool_name)


def boot(conn: Any, image: str, flavor: str, **extra: Any) -> Any:
    """A server booted by ``conn``'s project, ACTIVE; raises ResourceFailure if Nova refuses."""
    server = conn.compute.create_server(
        name=f"climate-{uuid.uuid4().hex[:6]}",
        image_id=image,
        flavor_id=flavor,
        networks="none",
        **extra,
    )
    return conn.compute.wait_for_server(server, status="ACTIVE", failures=["ERROR"], wait=60)


HOST_FIELDS = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}


def lease_now(
    ctx: ServiceContext,
    clock: ManualClock,
    actor: Actor,
    resource_type: str = "physical:host",
    *,
    name: str = "on-the-rig",
    length: dt.timedelta = dt.timedelta(hours=1),
    **fields: Any,
) -> Lease:
    """A lease of one reservation starting now (``clock`` set to now, whole seconds): one host
    unless ``fields`` say otherwise, or, for ``virtual:instance``, what ``fields`` ask."""
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    clock.set(start)
    if resource_type == "physical:host":
        fields = HOST_FIELDS | fields
    request = LeaseRequest(
        name=name,
        start=start,
        end=start + length,
        reservations=[ReservationRequest(resource_type, fields)],
    )
    return LeaseService(ctx).create(actor, request)
