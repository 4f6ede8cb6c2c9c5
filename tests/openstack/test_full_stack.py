"""The whole of Climate against the rig: a live ``climate serve`` (API, manager and its Nova
monitor) with ``backend = "openstack"`` and ``auth = "keystone"``, driven over HTTP with real
Keystone tokens: the admin enrols computes, a member's host lease starting now becomes ACTIVE
with its host in the reservation's aggregate, and its delete ends it with the host back in the
freepool. Proved with openstacksdk calls."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import httpx

from climate.config import Settings
from tests.conftest import serve
from tests.openstack.conftest import Member, aggregate, empty_freepool, rig_settings


def token(auth_url: str, user: str, password: str, project: str) -> str:
    scope = {"project": {"name": project, "domain": {"id": "default"}}}
    identity = {
        "methods": ["password"],
        "password": {"user": {"name": user, "domain": {"id": "default"}, "password": password}},
    }
    response = httpx.post(
        f"{auth_url}/auth/tokens", json={"auth": {"identity": identity, "scope": scope}}
    )
    assert response.status_code == 201, response.text
    return response.headers["X-Subject-Token"]


def until(check: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.1)


def test_a_member_leases_a_compute_through_keystone_and_nova(
    openstack_env: dict[str, str],
    settings: Settings,
    sqlite_url: str,
    cloud: Any,
    members: Callable[[], Member],
) -> None:
    env = openstack_env
    merged = {**rig_settings(env).model_dump(exclude_unset=True), "auth": "keystone"}
    here = settings.model_copy(update=merged)
    freepool = here.freepool_name
    member = members()
    auth_url = env["OS_AUTH_URL"]
    admin_token = token(auth_url, env["OS_USERNAME"], env["OS_PASSWORD"], env["OS_PROJECT_NAME"])
    member_token = token(auth_url, member.name, member.password, member.project_name)
    reservation_id = ""
    try:
        with serve(here, sqlite_url) as server:
            assert server.workers.monitor is not None  # the openstack backend watches Nova
            admin = httpx.Client(
                base_url=f"{server.url}/v1", headers={"X-Auth-Token": admin_token}, timeout=60
            )
            lessee = httpx.Client(
                base_url=f"{server.url}/v1", headers={"X-Auth-Token": member_token}, timeout=60
            )
            for name in ("compute1", "compute2"):
                response = admin.post("/os-hosts", json={"name": name})
                assert response.status_code == 201, response.text
                assert response.json()["host"]["vcpus"] == 16
            assert {"compute1", "compute2"} <= set(aggregate(cloud, freepool).hosts)
            assert lessee.post("/os-hosts", json={"name": "compute3"}).status_code == 403
            assert httpx.get(f"{server.url}/v1/leases").status_code == 401

            now = dt.datetime.now(dt.UTC)
            response = lessee.post(
                "/leases",
                json={
                    "name": "full-stack",
                    "start_date": "now",
                    "end_date": (now + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"),
                    "reservations": [
                        {
                            "resource_type": "physical:host",
                            "min": 1,
                            "max": 1,
                            "hypervisor_properties": "",
                            "resource_properties": "",
                        }
                    ],
                    "events": [],
                },
            )
            assert response.status_code == 201, response.text
            lease = response.json()["lease"]
            assert lease["project_id"] == member.actor.project_id
            reservation_id = lease["reservations"][0]["id"]

            def shown() -> dict[str, Any]:
                found: dict[str, Any] = lessee.get(f"/leases/{lease['id']}").json()["lease"]
                return found

            until(lambda: shown()["status"] == "ACTIVE")
            assert [r["status"] for r in shown()["reservations"]] == ["active"]
            pool = aggregate(cloud, reservation_id)
            (host,) = pool.hosts
            assert pool.metadata["blazar:owner"] == member.actor.project_id
            assert pool.availability_zone == f"blazar_{reservation_id}"
            assert host not in (aggregate(cloud, freepool).hosts or [])

            assert lessee.delete(f"/leases/{lease['id']}").status_code == 204
            until(lambda: aggregate(cloud, reservation_id) is None)
            assert {"compute1", "compute2"} <= set(aggregate(cloud, freepool).hosts)
            until(lambda: lessee.get(f"/leases/{lease['id']}").status_code == 404)
    finally:
        leftover = aggregate(cloud, reservation_id) if reservation_id else None
        if leftover is not None:
            for name in list(leftover.hosts or []):
                leftover = cloud.compute.remove_host_from_aggregate(leftover, name)
            cloud.compute.delete_aggregate(leftover)
        empty_freepool(cloud, freepool)
