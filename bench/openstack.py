"""``python -m bench --scenario openstack``: how soon a lease is usable in a real Nova.

Against the OpenStack rig (../shared/openstack, already running: ``OSTEST_BASE``, default
/tmp/os-local), a real ``climate serve`` with ``backend = "openstack"`` (the rig's admin as its
service user, a freepool of its own) and the rig's three computes enrolled over HTTP:

- hosts: a lease of the 3 hosts starting ``now``; the time from its ``POST /v1/leases`` to the 3
  hosts in the reservation's aggregate, as openstacksdk reads it; then from its ``DELETE`` to the
  aggregate gone and the 3 hosts back in the freepool;
- instances: a lease of 20 instance reservations (1 vCPU, 512 MB, 1 GB each) starting ``now``;
  the time to the 20 flavors ``reservation:<id>`` and the 20 ``CUSTOM_RESERVATION_<ID>``
  inventories on the ``blazar_<host>`` providers in place; then from its ``DELETE`` to all of
  them gone.

Beside them, Blazar 18 on the same rig (issue 12): 6.3-13.9 s, median about 10 s, from the POST
of a lease starting now to its host in the aggregate (its manager polls events every 10 s).
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.server import climate_server
from bench.stats import table
from bench.targets import Target
from climate.backends.openstack.placement import resource_class

HOSTS = ("compute1", "compute2", "compute3")
INSTANCES = 20
BLAZAR = "Blazar 18: 6.3-13.9 s, median ~10 s"
POLL = 0.02


def rig_env() -> dict[str, str]:
    base = os.environ.get("OSTEST_BASE", "/tmp/os-local")
    path = Path(base, "ostest.env")
    if not path.is_file():
        raise SystemExit(f"the OpenStack rig is not running ({path} missing): start it first")
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def admin_connection(env: dict[str, str]) -> Any:
    """openstacksdk as the rig's admin: credentials as one ``auth`` dict, and neither
    clouds.yaml nor ``OS_*`` variables read (the SDK would mix the rig's admin into them)."""
    import openstack

    return openstack.connect(
        auth={
            "auth_url": env["OS_AUTH_URL"],
            "username": env["OS_USERNAME"],
            "password": env["OS_PASSWORD"],
            "project_name": env["OS_PROJECT_NAME"],
            "user_domain_name": "Default",
            "project_domain_name": "Default",
        },
        region_name="RegionOne",
        load_yaml_config=False,
        load_envvars=False,
        connect_retries=3,  # a keep-alive connection the service dropped as a request went out
    )


def aggregate(cloud: Any, name: str) -> Any:
    """The aggregate called ``name`` (``cloud``: a connection or its compute proxy), or None."""
    compute = getattr(cloud, "compute", cloud)
    return next((a for a in compute.aggregates() if a.name == name), None)


def _until(check: Callable[[], bool], seconds: float = 120) -> float:
    began = time.perf_counter()
    while not check():
        if time.perf_counter() - began > seconds:
            raise TimeoutError(f"not within {seconds} s")
        time.sleep(POLL)
    return time.perf_counter() - began


def _inventories(conn: Any) -> set[str]:
    """Resource classes with an inventory on any ``blazar_<host>`` provider."""
    found: set[str] = set()
    for host in HOSTS:
        listed = conn.placement.get(f"/resource_providers?name=blazar_{host}").json()
        for provider in listed["resource_providers"]:
            url = f"/resource_providers/{provider['uuid']}/inventories"
            found |= set(conn.placement.get(url).json()["inventories"])
    return found


def _flavors(conn: Any) -> set[str]:
    return {f.name for f in conn.compute.flavors(is_public=None)}


def _lease(http: httpx.Client, name: str, reservations: list[dict[str, Any]]) -> Any:
    body = {
        "name": name,
        "start_date": "now",
        "end_date": "2099-01-01 00:00",
        "reservations": reservations,
        "events": [],
    }
    began = time.perf_counter()
    response = http.post("/leases", json=body)
    posted = time.perf_counter() - began
    response.raise_for_status()
    return response.json()["lease"], began, posted


def _hosts_round(http: httpx.Client, conn: Any, freepool: str, r: int) -> dict[str, float]:
    request = {
        "resource_type": "physical:host",
        "min": len(HOSTS),
        "max": len(HOSTS),
        "hypervisor_properties": "",
        "resource_properties": "",
    }
    lease, began, posted = _lease(http, f"hosts-{r}", [request])
    rid = lease["reservations"][0]["id"]

    def moved() -> bool:
        return set(getattr(aggregate(conn, rid), "hosts", None) or []) == set(HOSTS)

    _until(moved)
    start = time.perf_counter() - began
    began = time.perf_counter()
    http.delete(f"/leases/{lease['id']}").raise_for_status()

    def back() -> bool:
        pool = aggregate(conn, freepool)
        return aggregate(conn, rid) is None and set(pool.hosts or []) == set(HOSTS)

    _until(back)
    return {"post": posted, "start": start, "end": time.perf_counter() - began}


def _instances_round(http: httpx.Client, conn: Any, r: int) -> dict[str, float]:
    request = {
        "resource_type": "virtual:instance",
        "amount": 1,
        "vcpus": 1,
        "memory_mb": 512,
        "disk_gb": 1,
        "affinity": None,
        "resource_properties": "",
    }
    lease, began, posted = _lease(http, f"instances-{r}", [request] * INSTANCES)
    ids = [x["id"] for x in lease["reservations"]]
    flavors = {f"reservation:{i}" for i in ids}
    classes = {resource_class(i) for i in ids}
    _until(lambda: flavors <= _flavors(conn) and classes <= _inventories(conn))
    start = time.perf_counter() - began
    began = time.perf_counter()
    http.delete(f"/leases/{lease['id']}").raise_for_status()
    _until(lambda: not flavors & _flavors(conn) and not classes & _inventories(conn))
    return {"post": posted, "start": start, "end": time.perf_counter() - began}


def run_openstack(rounds: int = 3) -> dict[str, Any]:
    env = rig_env()
    conn = admin_connection(env)
    freepool = f"bench-freepool-{uuid.uuid4().hex[:6]}"
    server_env = {
        "CLIMATE_BACKEND": "openstack",
        "CLIMATE_FREEPOOL_NAME": freepool,
        "CLIMATE_BACKEND_TIMEOUT_SECONDS": "120",
        "OS_AUTH_URL": env["OS_AUTH_URL"],
        "OS_USERNAME": env["OS_USERNAME"],
        "OS_PASSWORD": env["OS_PASSWORD"],
        "OS_PROJECT_NAME": env["OS_PROJECT_NAME"],
        "OS_USER_DOMAIN_NAME": "Default",
        "OS_PROJECT_DOMAIN_NAME": "Default",
        "OS_REGION_NAME": env.get("OS_REGION_NAME", "RegionOne"),
    }
    for name in ("OS_CLOUD", "OS_CLIENT_CONFIG_FILE"):
        os.environ.pop(name, None)
    found: dict[str, list[float]] = {
        "hosts_post": [],
        "hosts_start": [],
        "hosts_end": [],
        "instances_post": [],
        "instances_start": [],
        "instances_end": [],
    }
    try:
        with (
            climate_server("sqlite", extra_env=server_env) as server,
            httpx.Client(
                base_url=f"{server.base_url}/v1",
                timeout=300,
                # noauth, as the rig's admin: Nova checks that a flavor's project exists.
                headers={
                    "X-Project-Id": conn.current_project_id,
                    "X-User-Id": conn.current_user_id,
                    "X-Roles": "admin",
                },
            ) as http,
        ):
            for host in HOSTS:
                http.post("/os-hosts", json={"name": host}).raise_for_status()
            for r in range(rounds):
                for key, value in _hosts_round(http, conn, freepool, r).items():
                    found[f"hosts_{key}"].append(value)
                for key, value in _instances_round(http, conn, r).items():
                    found[f"instances_{key}"].append(value)
    finally:
        pool = aggregate(conn, freepool)
        if pool is not None:
            for host in list(pool.hosts or []):
                pool = conn.compute.remove_host_from_aggregate(pool, host)
            conn.compute.delete_aggregate(pool)
    return found


def print_openstack(found: dict[str, list[float]]) -> None:
    rows = []
    for key, values in found.items():
        rows.append(
            [
                key,
                len(values),
                f"{min(values):.2f} s",
                f"{statistics.median(values):.2f} s",
                f"{max(values):.2f} s",
            ]
        )
    print()
    print("openstack: from POST (start) or DELETE (end) until Nova and Placement show it")
    print(table(["", "n", "min", "median", "max"], rows))
    print(f"  beside: {BLAZAR} from the POST of a lease starting now to its host in the aggregate")


def openstack_targets(found: dict[str, list[float]]) -> list[Target]:
    return [
        Target(
            "3 hosts in their aggregate after the POST (median)",
            statistics.median(found["hosts_start"]),
            1.0,
            "s",
            note=BLAZAR,
        ),
        Target(
            "3 hosts back in the freepool after the DELETE (median)",
            statistics.median(found["hosts_end"]),
            1.0,
            "s",
        ),
    ]
