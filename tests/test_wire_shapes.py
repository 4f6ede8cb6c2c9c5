"""Our JSON next to Blazar's published API samples (tests/golden), and Blazar's headers.

Every key a Blazar sample shows for a lease, a ``physical:host`` reservation, an event, a host,
an allocation and a resource property must be in our response with the same JSON type; dates
must also be written the way Blazar writes them (the blazar CLI parses lease dates with a fixed
format). The requests are Blazar's own sample requests, moved to the future where they hold
dates.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer

GOLDEN = Path(__file__).parent / "golden"
REQUEST_ID = re.compile(r"^req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
LOOKS_LIKE_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}")
API_DATE = "%Y-%m-%d %H:%M"
LEASE_DATE = "%Y-%m-%dT%H:%M:%S.%f"
# Climate has no Keystone trusts, so trust_id is null where Blazar's samples show one (Blazar's
# own lease column is nullable; the blazar CLI prints null as an empty cell).
MAY_BE_NULL = frozenset({"trust_id"})
# The inventory Blazar reads from Nova; Climate's standalone backend takes it from the request.
INVENTORY_KEYS = (
    "hypervisor_type",
    "hypervisor_version",
    "vcpus",
    "cpu_info",
    "memory_mb",
    "local_gb",
)
# Reservation fields that echo the request or report the initial state.
ECHOED_RESERVATION_KEYS = (
    "resource_type",
    "status",
    "missing_resources",
    "resources_changed",
    "min",
    "max",
    "hypervisor_properties",
    "resource_properties",
    "before_end",
)


def golden(name: str) -> Any:
    """A sample; the host samples hold a multi-line string, which strict JSON forbids."""
    return json.loads((GOLDEN / name).read_text(), strict=False)


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r}")


def _digits_masked(text: str) -> str:
    return re.sub(r"\d", "9", text)


def assert_like(ours: dict[str, Any], sample: dict[str, Any], what: str) -> None:
    """Every key of ``sample`` is in ``ours`` with the same JSON type (and date layout)."""
    problems = []
    for key, expected in sample.items():
        if key not in ours:
            problems.append(f"{what}.{key}: missing (Blazar sends {expected!r})")
            continue
        got = ours[key]
        if expected is None:
            # A null in a sample carries no type; Blazar's nullable fields there are strings.
            same_type = got is None or isinstance(got, str)
        elif got is None:
            same_type = key in MAY_BE_NULL
        else:
            same_type = json_type(got) == json_type(expected)
        if not same_type:
            problems.append(
                f"{what}.{key}: we send {json_type(got)} {got!r}, "
                f"Blazar sends {json_type(expected)} {expected!r}"
            )
        elif (
            isinstance(expected, str)
            and isinstance(got, str)
            and LOOKS_LIKE_DATE.match(expected)
            and _digits_masked(got) != _digits_masked(expected)
        ):
            problems.append(f"{what}.{key}: date {got!r} is not laid out like {expected!r}")
    assert not problems, "\n".join(problems)


def sample_host() -> dict[str, Any]:
    host: dict[str, Any] = golden("hosts/host-create-resp.json")["host"]
    return host


def host_body(name: str) -> dict[str, Any]:
    """Blazar's host-create request plus the inventory Blazar would get from Nova."""
    body: dict[str, Any] = golden("hosts/host-create-req.json")
    body["name"] = name
    body.update({key: sample_host()[key] for key in INVENTORY_KEYS})
    return body


def sample_lease(name: str) -> dict[str, Any]:
    body: dict[str, Any] = golden(f"leases/{name}")
    lease: dict[str, Any] = body["leases"][0] if "leases" in body else body["lease"]
    return lease


def host_reservation(lease: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        r for r in lease["reservations"] if r["resource_type"] == "physical:host"
    ]
    assert len(found) == 1, found
    return found[0]


def event_of(lease: dict[str, Any], event_type: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [e for e in lease["events"] if e["event_type"] == event_type]
    assert len(found) == 1, found
    return found[0]


class Shift:
    """Moves the samples' 2017 dates to the future, keeping their spacing."""

    def __init__(self, sample_start: str, start: dt.datetime) -> None:
        self.delta = start - dt.datetime.strptime(sample_start, API_DATE).replace(tzinfo=dt.UTC)

    def request(self, value: str) -> str:
        moved = dt.datetime.strptime(value, API_DATE).replace(tzinfo=dt.UTC) + self.delta
        return moved.strftime(API_DATE)

    def response(self, value: str) -> str:
        moved = dt.datetime.strptime(value, LEASE_DATE).replace(tzinfo=dt.UTC) + self.delta
        return moved.strftime(LEASE_DATE)


def assert_lease_like(
    ours: dict[str, Any],
    sample: dict[str, Any],
    shift: Shift,
    event_times: dict[str, str] | None = None,
) -> None:
    """``ours`` is like ``sample``; events are at the sample's times unless given."""
    assert_like(ours, sample, "lease")
    assert (ours["name"], ours["status"], ours["degraded"]) == (
        sample["name"],
        sample["status"],
        sample["degraded"],
    )
    assert ours["start_date"] == shift.response(sample["start_date"])
    assert ours["end_date"] == shift.response(sample["end_date"])
    (reservation,) = ours["reservations"]
    expected = host_reservation(sample)
    assert_like(reservation, expected, "reservation")
    assert reservation["lease_id"] == ours["id"]
    assert {k: reservation[k] for k in ECHOED_RESERVATION_KEYS} == {
        k: expected[k] for k in ECHOED_RESERVATION_KEYS
    }
    assert sorted(e["event_type"] for e in ours["events"]) == sorted(
        e["event_type"] for e in sample["events"]
    )
    for event in ours["events"]:
        expected_event = event_of(sample, event["event_type"])
        assert_like(event, expected_event, f"event {event['event_type']}")
        assert event["lease_id"] == ours["id"]
        assert event["status"] == expected_event["status"]
        expected_time = (event_times or {}).get(event["event_type"])
        assert event["time"] == (expected_time or shift.response(expected_event["time"]))


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=10, trust_env=False) as http:
        yield http


@pytest.fixture
def client_sqlite(live_sqlite: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_sqlite.url, timeout=10, trust_env=False) as http:
        yield http


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def test_host_shapes_match_blazar_samples(client: httpx.Client) -> None:
    created = _ok(client.post("/v1/os-hosts", json=host_body("compute-1")), 201)["host"]
    assert_like(created, sample_host(), "host-create")
    assert {k: created[k] for k in (*INVENTORY_KEYS, "extra_capability_sample")} == {
        k: sample_host()[k] for k in (*INVENTORY_KEYS, "extra_capability_sample")
    }
    assert (created["hypervisor_hostname"], created["service_name"]) == (
        "compute-1",
        "compute-1",
    )
    assert created["reservable"] is True

    shown = _ok(client.get(f"/v1/os-hosts/{created['id']}"))["host"]
    assert_like(shown, golden("hosts/host-details-resp.json")["host"], "host-show")
    assert shown == created

    (listed,) = _ok(client.get("/v1/os-hosts"))["hosts"]
    assert_like(listed, golden("hosts/host-list-resp.json")["hosts"][0], "host-list")
    assert listed == created

    update = golden("hosts/host-update-req.json")
    updated = _ok(client.put(f"/v1/os-hosts/{created['id']}", json=update))["host"]
    assert_like(updated, golden("hosts/host-update-resp.json")["host"], "host-update")
    assert updated["extra_capability_sample"] == update["extra_capability_sample"] == "bar"
    assert isinstance(updated["updated_at"], str)
    assert_like(updated, {"updated_at": sample_host()["created_at"]}, "host-update")


def test_property_shapes_match_blazar_samples(client_sqlite: httpx.Client) -> None:
    client = client_sqlite
    _ok(client.post("/v1/os-hosts", json=host_body("compute-1")), 201)
    _ok(client.post("/v1/os-hosts", json=host_body("compute-2") | {"gpu": "True"}), 201)

    names = _ok(client.get("/v1/os-hosts/properties"))["resource_properties"]
    for entry in names:
        assert_like(entry, golden("hosts/host-property-list.json")["resource_properties"][0], "p")
    assert names == [{"property": "extra_capability_sample"}, {"property": "gpu"}]

    detail = _ok(client.get("/v1/os-hosts/properties", params={"detail": "True"}))
    sample = golden("hosts/host-property-list-detail.json")["resource_properties"][0]
    for entry in detail["resource_properties"]:
        assert_like(entry, sample, "property detail")
    assert detail["resource_properties"] == [
        {"property": "extra_capability_sample", "private": False, "values": ["foo"]},
        {"property": "gpu", "private": False, "values": ["True"]},
    ]

    patch = golden("hosts/host-property-update.json")
    updated = _ok(client.patch("/v1/os-hosts/properties/gpu", json=patch))["resource_property"]
    sample_update = golden("hosts/host-property-update-res.json")["resource_property"]
    # Known difference, kept: Blazar's sample writes these two stamps as ISO 8601 with
    # microseconds and shows updated_at set; we write "YYYY-MM-DD HH:MM:SS" (as for leases and
    # hosts) and updated_at stays null on the first change. The blazar CLI ignores the body.
    stamps = {"created_at", "updated_at"}
    assert_like(updated, {k: v for k, v in sample_update.items() if k not in stamps}, "property")
    assert stamps <= set(updated) and isinstance(updated["created_at"], str)
    assert (updated["property_name"], updated["private"], updated["resource_type"]) == (
        "gpu",
        True,
        "physical:host",
    )
    # Private now: listed for an admin asking for all, hidden otherwise.
    public = _ok(client.get("/v1/os-hosts/properties"))["resource_properties"]
    assert public == [{"property": "extra_capability_sample"}]
    everything = _ok(client.get("/v1/os-hosts/properties", params={"all": "True"}))
    assert [p["property"] for p in everything["resource_properties"]] == [
        "extra_capability_sample",
        "gpu",
    ]


def test_lease_and_allocation_shapes_match_blazar_samples(client: httpx.Client) -> None:
    host_ids = [
        _ok(client.post("/v1/os-hosts", json=host_body(f"compute-{i}")), 201)["host"]["id"]
        for i in range(1, 7)
    ]
    request = golden("leases/lease-create-req.json")
    request["reservations"] = [host_reservation(request)]  # no virtual:instance in Climate
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(second=0, microsecond=0)
    shift = Shift(request["start_date"], start)
    for key in ("start_date", "end_date", "before_end_date"):
        request[key] = shift.request(request[key])

    created = _ok(client.post("/v1/leases", json=request), 201)["lease"]
    assert_lease_like(created, sample_lease("lease-create-resp.json"), shift)
    (reservation,) = created["reservations"]
    held = {a["resource_id"] for a in reservation["allocations"]}
    assert 4 <= len(held) <= 6 and held <= set(host_ids)

    shown = _ok(client.get(f"/v1/leases/{created['id']}"))["lease"]
    assert_lease_like(shown, sample_lease("lease-details-resp.json"), shift)
    (listed,) = _ok(client.get("/v1/leases"))["leases"]
    assert_lease_like(listed, sample_lease("lease-list-resp.json"), shift)

    allocations = _ok(client.get("/v1/os-hosts/allocations"))["allocations"]
    sample_list = golden("hosts/allocation-list-resp.json")["allocations"]
    assert sorted(a["resource_id"] for a in allocations) == sorted(host_ids)
    for allocation in allocations:
        assert_like(allocation, sample_list[0], "allocation")
        for entry in allocation["reservations"]:
            assert_like(entry, sample_list[0]["reservations"][0], "allocation reservation")
            assert (entry["id"], entry["lease_id"]) == (reservation["id"], created["id"])
            assert (entry["start_date"], entry["end_date"]) == (
                created["start_date"],
                created["end_date"],
            )
    assert {a["resource_id"] for a in allocations if a["reservations"]} == held

    some_host = sorted(held)[0]
    one = _ok(client.get(f"/v1/os-hosts/{some_host}/allocation"))["allocation"]
    sample_one = golden("hosts/allocation-get-resp.json")["allocation"]
    assert_like(one, sample_one, "allocation-get")
    assert one["resource_id"] == some_host
    (entry,) = one["reservations"]
    assert_like(entry, sample_one["reservations"][0], "allocation-get reservation")
    assert entry["lease_id"] == created["id"]

    update = golden("leases/lease-update-req.json")
    update["end_date"] = shift.request(update["end_date"])
    update["reservations"] = [
        dict(update["reservations"][0], id=reservation["id"])  # the physical:host one
    ]
    updated = _ok(client.put(f"/v1/leases/{created['id']}", json=update))["lease"]
    # The update sample left its events as they were; Blazar moves the end event with the end
    # and keeps the before-end event as far from the end as it was (an hour here).
    new_end = shift.response("2017-12-28T12:00:00.000000")
    moved = {"end_lease": new_end, "before_end_lease": shift.response("2017-12-28T11:00:00.000000")}
    assert_lease_like(updated, sample_lease("lease-update-resp.json"), shift, moved)
    assert updated["end_date"] == new_end
    assert len(updated["reservations"][0]["allocations"]) == 6  # min 6, max 8, six hosts
    assert isinstance(updated["updated_at"], str)


def _assert_blazar_headers(response: httpx.Response) -> str:
    assert response.headers["OpenStack-API-Version"] == "reservation 1.0", response.headers
    assert "OpenStack-API-Version" in response.headers["Vary"], response.headers
    request_id = response.headers["x-openstack-request-id"]
    assert REQUEST_ID.match(request_id), request_id
    return request_id


def test_every_response_carries_blazar_headers(client_sqlite: httpx.Client) -> None:
    client = client_sqlite
    created = client.post("/v1/os-hosts", json=host_body("compute-1"))
    responses = [
        client.get("/v1/leases"),
        created,
        client.get("/v1/os-hosts", headers={"OpenStack-API-Version": "reservation latest"}),
        client.get("/v1/os-hosts", headers={"OpenStack-API-Version": "reservation 1.0"}),
        client.delete(f"/v1/os-hosts/{created.json()['host']['id']}"),
        client.get("/v1/leases/no-such-lease"),
        client.post("/v1/leases", content=b"{not json"),
        client.get("/v1/no-such-collection"),
        client.get("/"),
    ]
    assert [r.status_code for r in responses] == [200, 201, 200, 200, 204, 404, 400, 404, 300]
    ids = [_assert_blazar_headers(r) for r in responses]
    assert len(set(ids)) == len(ids)
    for response in responses:
        if response.status_code >= 400:
            body = response.json()
            routing = {"error"} if response.request.url.path == "/v1/no-such-collection" else set()
            assert set(body) == {"error_code", "error_message", "error_name"} | routing
            assert body["error_code"] == response.status_code
            assert body["error_message"]


def test_version_document_is_blazars(live_sqlite: LiveServer, client_sqlite: httpx.Client) -> None:
    client = client_sqlite
    expected = {
        "versions": [
            {
                "id": "v1.0",
                "status": "CURRENT",
                "links": [{"href": f"{live_sqlite.url}/v1", "rel": "self"}],
                "min_version": "1.0",
                "max_version": "1.0",
            }
        ]
    }
    for path in ("/", "/versions"):
        response = client.get(path)
        assert response.status_code == 300
        assert response.headers["content-type"] == "application/json"
        assert response.json() == expected
