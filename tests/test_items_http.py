"""Devices, network segments, floating IPs and volume pools over HTTP: the inventory APIs, a
lease mixing every resource type, and the answers checked against the OpenAPI document."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from tests.conftest import LiveServer

if TYPE_CHECKING:
    from tests.test_openapi import Conformance

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
INVENTORIES = {
    "/v1/devices": ("device", {"name": "gpu-0", "model": "a100"}, {"name": "gpu-1", "x": [1]}),
    "/v1/networks": (
        "network",
        {"network_type": "vlan", "physical_network": "physnet1", "segment_id": 100},
        {"network_type": "vlan", "segment_id": 0},
    ),
    "/v1/floatingips": (
        "floatingip",
        {"floating_network_id": "ext-net", "floating_ip_address": "172.24.4.101"},
        {"floating_network_id": "ext-net", "floating_ip_address": "172.24.4.300"},
    ),
    "/v1/volume-pools": (
        "volume_pool",
        {"name": "ssd-1", "capacity_gb": 100, "tier": "ssd"},
        {"name": "ssd-2", "capacity_gb": 0},
    ),
}
EVERY_TYPE = [
    {"resource_type": "physical:host", "min": 1, "max": 1},
    {
        "resource_type": "device",
        "min": "1",
        "max": "1",
        "resource_properties": '["==", "$model", "a100"]',
    },
    {"resource_type": "network", "network_properties": '["==", "$physical_network", "physnet1"]'},
    {"resource_type": "virtual:floatingip", "network_id": "ext-net", "amount": 1},
    {"resource_type": "virtual:volume", "size_gb": 30, "amount": 2, "pool": "ssd-1"},
]


def mixed_lease(name: str, start: str, end: str) -> dict[str, Any]:
    return {"name": name, "start_date": start, "end_date": end, "reservations": EVERY_TYPE}


def call_item_operations(call: Conformance) -> None:
    """Every inventory operation of the non-host types, and a lease holding one of each."""
    call("POST", "/v1/os-hosts", 201, json={"name": "mixed-host"})
    ids = {}
    for path, (key, good, bad) in INVENTORIES.items():
        one = "{pool_id}" if key == "volume_pool" else "{item_id}"
        param = one.strip("{}")
        created = call("POST", path, 201, json=good).json()[key]
        ids[path] = (one, param, created["id"])
        call("POST", path, 409, json=good)
        call("POST", path, 400, json=bad)
        call("GET", path, 200)
        call("GET", path, 403, headers=MEMBER)
        call("GET", f"{path}/{one}", 200, at={param: created["id"]})
        call("GET", f"{path}/{one}", 404, at={param: "99"})
        call("PUT", f"{path}/{one}", 200, json={"colour": "blue"}, at={param: created["id"]})
    lease = call(
        "POST", "/v1/leases", 201, json=mixed_lease("every", "2031-03-01 10:00", "2031-03-02 10:00")
    ).json()["lease"]
    assert [len(r["allocations"]) for r in lease["reservations"]] == [1, 1, 1, 1, 1]
    for path, (one, param, found) in ids.items():
        call("GET", f"{path}/allocations", 200)
        call("GET", f"{path}/allocations", 200, headers=MEMBER)
        call("GET", f"{path}/{one}/allocation", 200, at={param: found})
        call("DELETE", f"{path}/{one}", 409, at={param: found})
    call("DELETE", "/v1/leases/{lease_id}", 204, at={"lease_id": lease["id"]})
    for path, (one, param, found) in ids.items():
        call("DELETE", f"{path}/{one}", 204, at={param: found})


def test_a_lease_holds_one_of_every_type_and_shows_their_fields(live: LiveServer) -> None:
    with httpx.Client(base_url=f"{live.url}/v1", timeout=30) as http:
        http.post("/os-hosts", json={"name": "h1"}).raise_for_status()
        for path, (_, good, _) in INVENTORIES.items():
            http.post(path.removeprefix("/v1"), json=good).raise_for_status()
        body = mixed_lease("every", "2031-03-01 10:00", "2031-03-02 10:00")
        created = http.post("/leases", json=body)
        assert created.status_code == 201, created.text
        shown = http.get(f"/leases/{created.json()['lease']['id']}").json()["lease"]
        by_type = {r["resource_type"]: r for r in shown["reservations"]}
        assert by_type["virtual:floatingip"]["network_id"] == "ext-net"
        assert by_type["virtual:floatingip"]["required_floatingips"] == []
        assert by_type["network"]["amount"] == 1
        assert by_type["virtual:volume"]["size_gb"] == 30
        assert by_type["device"]["min"] == 1
        assert all(len(r["allocations"]) == 1 for r in shown["reservations"])
        (fip,) = http.get("/floatingips").json()["floatingips"]
        assert by_type["virtual:floatingip"]["allocations"][0]["resource_id"] == fip["id"]
        allocation = http.get(f"/floatingips/{fip['id']}/allocation").json()["allocation"]
        assert [r["lease_id"] for r in allocation["reservations"]] == [shown["id"]]
        pools = http.get("/volume-pools/allocations").json()["allocations"]
        assert [r["size_gb"] for r in pools[0]["reservations"]] == [60]

        # Too big for any pool: 400 naming the field; not enough left: 409 with the reason.
        huge = {**EVERY_TYPE[4], "size_gb": 60}
        refused = http.post(
            "/leases",
            json={**body, "name": "huge", "reservations": [huge]},
        )
        assert refused.status_code == 400
        assert refused.json()["error_message"].startswith("size_gb: 2 x 60 GB = 120 GB")
        full = http.post("/leases", json={**body, "name": "again"})
        assert full.status_code == 409
        assert "Not enough" in full.json()["error_message"]
        # The refusal left nothing behind: one lease, and each device or address held once.
        assert len(http.get("/leases").json()["leases"]) == 1
        held = http.get("/devices/allocations").json()["allocations"]
        assert [len(a["reservations"]) for a in held] == [1]
