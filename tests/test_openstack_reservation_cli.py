"""Compatibility: python-blazarclient's ``openstack reservation`` plugin against Climate, with
``OS_AUTH_TYPE=none`` as in ``test_blazar_cli.py``. Each answer below was first compared with
the real Blazar 18's to the same commands: where both agree the test pins it, where Climate
says more (a field named, the free count) it pins Blazar's words inside Climate's.

An ``openstack`` call costs about a second of start-up, so setup and checks go to the API.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.test_blazar_cli import (
    Blazar,
    add_host,
    add_lease,
    api_lease,
    cli_date,
    cli_env,
    lease_date,
    minute,
    objects,
)

OPENSTACK = Path(sys.executable).with_name("openstack")
NETWORK = "1e17587e-a7ed-4b82-a17b-4beb32523e28"
SIZED = {"vcpus": "32", "memory_mb": "131072", "local_gb": "1000"}


@pytest.fixture
def osc(live_sqlite: LiveServer) -> Blazar:
    assert OPENSTACK.exists(), f"{OPENSTACK} is missing; install python-openstackclient"
    env = cli_env(live_sqlite.url, OS_AUTH_TYPE="none")
    return Blazar(env, (str(OPENSTACK), "reservation"))


def add_floating_ips(api: httpx.Client, *addresses: str) -> None:
    for address in addresses:
        body = {"floating_network_id": NETWORK, "floating_ip_address": address}
        assert api.post("/v1/floatingips", json=body).status_code == 201


def by_type(lease: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["resource_type"]: r for r in lease["reservations"]}


def test_a_lease_of_three_types_is_created_changed_and_deleted(
    osc: Blazar, api: httpx.Client
) -> None:
    add_host(api, "node-1", gpu="a1", **SIZED)
    v100 = add_host(api, "node-2", gpu="a2", **SIZED)
    add_floating_ips(api, "172.24.4.101", "172.24.4.102", "172.24.4.103")
    start = minute(dt.timedelta(days=10))
    end = start + dt.timedelta(days=1)

    created = osc.json(
        "lease",
        "create",
        "--reservation",
        'resource_type=physical:host,min=1,max=1,resource_properties=["==","$gpu","a2"]',
        "--reservation",
        "resource_type=virtual:instance,amount=2,vcpus=2,memory_mb=2048,disk_gb=20",
        "--reservation",
        f"resource_type=virtual:floatingip,network_id={NETWORK},amount=1,"
        'required_floatingips=["172.24.4.102"]',
        "--start-date",
        cli_date(start),
        "--end-date",
        cli_date(end),
        "trio",
    )
    assert (created["name"], created["status"]) == ("trio", "PENDING")
    assert (created["start_date"], created["end_date"]) == (lease_date(start), lease_date(end))
    shown = {r["resource_type"]: r for r in objects(created["reservations"])}
    assert set(shown) == {"physical:host", "virtual:instance", "virtual:floatingip"}
    host, instances, ips = (
        shown["physical:host"],
        shown["virtual:instance"],
        shown["virtual:floatingip"],
    )
    assert [a["resource_id"] for a in host["allocations"]] == [v100]
    assert {k: instances[k] for k in ("amount", "vcpus", "memory_mb", "disk_gb", "affinity")} == {
        "amount": 2,
        "vcpus": 2,
        "memory_mb": 2048,
        "disk_gb": 20,
        "affinity": None,
    }
    assert (ips["network_id"], ips["amount"], ips["required_floatingips"]) == (
        NETWORK,
        1,
        ["172.24.4.102"],
    )

    # Several reservations and the end changed in one command, each by its id.
    assert "Updated lease: trio" in osc.ok(
        "lease",
        "set",
        "--reservation",
        f"id={instances['id']},amount=3,vcpus=4",
        "--reservation",
        f"id={ips['id']},amount=2",
        "--prolong-for",
        "1d",
        "trio",
    )
    lease = api_lease(api, created["id"])
    changed = by_type(lease)
    assert (changed["virtual:instance"]["amount"], changed["virtual:instance"]["vcpus"]) == (3, 4)
    assert changed["virtual:floatingip"]["amount"] == 2
    assert lease["end_date"] == lease_date(end + dt.timedelta(days=1))

    osc.ok("lease", "set", "--defer-by", "1h", "--reduce-by", "2h", "trio")
    lease = api_lease(api, created["id"])
    assert (lease["start_date"], lease["end_date"]) == (
        lease_date(start + dt.timedelta(hours=1)),
        lease_date(end + dt.timedelta(days=1, hours=-2)),
    )
    new_end = end + dt.timedelta(days=3)
    osc.ok("lease", "set", "--advance-by", "30m", "--end-date", cli_date(new_end), "trio")
    lease = api_lease(api, created["id"])
    assert (lease["start_date"], lease["end_date"]) == (
        lease_date(start + dt.timedelta(minutes=30)),
        lease_date(new_end),
    )

    # Refusals print Blazar's words, the field named first.
    zero = osc.fails("lease", "set", "--reservation", f"id={instances['id']},amount=0", "trio")
    assert "ERROR: reservations[0].amount: Malformed parameter amount must be >= 1" in zero
    bogus = osc.fails("lease", "set", "--reservation", "id=bogus,amount=1", "trio")
    assert "Please enter valid reservation IDs. Invalid reservation IDs are: bogus" in bogus
    too_many = osc.fails("lease", "set", "--reservation", f"id={host['id']},min=3,max=3", "trio")
    assert "ERROR: Not enough hosts available" in too_many
    assert by_type(api_lease(api, created["id"]))["physical:host"]["min"] == 1

    listed = json.loads(osc.ok("lease", "list", "-f", "json"))
    assert listed == [
        {
            "id": created["id"],
            "name": "trio",
            "start_date": lease_date(start + dt.timedelta(minutes=30)),
            "end_date": lease_date(new_end),
        }
    ]
    assert osc.ok("lease", "show", "trio", "-f", "value", "-c", "status") == "PENDING\n"
    osc.ok("lease", "delete", "trio")
    assert api.get("/v1/leases").json()["leases"] == []


def test_allocations_hosts_properties_and_floating_ips(osc: Blazar, api: httpx.Client) -> None:
    first = add_host(api, "node-1", gpu="a1")
    second = add_host(api, "node-2", gpu="a2")
    add_floating_ips(api, "172.24.4.101")
    end = minute(dt.timedelta(days=1))
    start = cli_date(end - dt.timedelta(hours=2))
    lease = add_lease(api, "held", start, end, '["==","$gpu","a2"]')

    listed = json.loads(osc.ok("allocation", "list", "host", "-f", "json"))
    assert [(a["resource_id"], len(a["reservations"])) for a in listed] == [
        (first, 0),
        (second, 1),
    ]
    shown = osc.json("allocation", "show", "host", "node-2", "--lease-id", lease["id"])
    (entry,) = objects(shown["reservations"])
    assert (shown["resource_id"], entry["lease_id"]) == (second, lease["id"])
    assert "Unable to find resource with name 'nope'" in osc.fails(
        "allocation", "show", "host", "nope"
    )

    osc.ok("host", "set", "--extra", "rack=r1", "node-2")
    assert osc.ok("host", "show", "node-2", "-f", "value", "-c", "rack") == "r1\n"
    missing = osc.fails("host", "show", "999")
    assert "ERROR:" in missing and "Object with {'host_id': '999'} not found" in missing
    properties = json.loads(osc.ok("host", "property", "list", "--detail", "-f", "json"))
    assert {"property": "gpu", "private": False, "property_values": ["a1", "a2"]} in properties
    assert "Updated host property: gpu" in osc.ok("host", "property", "set", "--private", "gpu")
    # As with Blazar, a private property is listed only with --all.
    assert osc.ok("host", "property", "list", "-f", "value") == "rack\n"

    (ip,) = json.loads(osc.ok("floatingip", "list", "-f", "json"))
    assert set(ip) == {"id", "floating_ip_address", "floating_network_id"}
    ip_shown = osc.json("floatingip", "show", ip["id"])
    assert (ip_shown["floating_ip_address"], ip_shown["subnet_id"]) == ("172.24.4.101", "")
    again = osc.fails("floatingip", "create", NETWORK, "172.24.4.101")
    assert "ERROR: floating_ip_address: floating IP 172.24.4.101" in again
    osc.ok("floatingip", "delete", ip["id"])
    assert api.get("/v1/floatingips").json()["floatingips"] == []


def test_an_active_floating_ip_reservation_grows_but_does_not_shrink(
    osc: Blazar, api: httpx.Client
) -> None:
    """As Blazar: an active reservation takes more addresses, and refuses to give any back
    (a 400 in Blazar's words)."""
    add_floating_ips(api, "172.24.4.101", "172.24.4.102", "172.24.4.103")
    body = {
        "name": "ips",
        "start_date": "now",
        "end_date": cli_date(minute(dt.timedelta(days=1))),
        "reservations": [
            {"resource_type": "virtual:floatingip", "network_id": NETWORK, "amount": 2}
        ],
        "events": [],
    }
    lease = api.post("/v1/leases", json=body).json()["lease"]
    reservation = lease["reservations"][0]["id"]
    deadline = time.monotonic() + 3
    while api_lease(api, lease["id"])["status"] != "ACTIVE":
        assert time.monotonic() < deadline, "the lease did not start"
        time.sleep(0.1)

    refused = osc.fails("lease", "set", "--reservation", f"id={reservation},amount=1", "ips")
    assert (
        "ERROR: amount: Floating IP reservation cannot be updated with requested parameters. "
        "Cannot remove allocations from an active reservation (the lease is active on 2"
    ) in refused
    shrink = {"reservations": [{"id": reservation, "amount": 1}]}
    assert api.put(f"/v1/leases/{lease['id']}", json=shrink).status_code == 400

    osc.ok("lease", "set", "--reservation", f"id={reservation},amount=3", "ips")
    (grown,) = api_lease(api, lease["id"])["reservations"]
    assert (grown["amount"], len(grown["allocations"])) == (3, 3)
