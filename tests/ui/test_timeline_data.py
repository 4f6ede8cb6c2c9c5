"""The data behind the dashboard, over real HTTP: ``GET /v1/timeline`` (rows of resources, bars
of allocations; other projects' bookings anonymous, enforced here on the server) and the page's
own files with their Content-Security-Policy."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest

from climate.api.ui import CONTENT_SECURITY_POLICY
from climate.config import Settings
from tests.conftest import LiveServer
from tests.test_auth import assert_error, client, created, issue, token_server

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
WINDOW = {"start": "2030-01-01 00:00", "end": "2030-01-10 00:00"}


def lease_body(name: str, day: int = 1) -> dict[str, Any]:
    """A one-host lease for [T0 + day, T0 + day + 1 day)."""
    start = T0 + dt.timedelta(days=day)
    return {
        "name": name,
        "start_date": start.strftime("%Y-%m-%d %H:%M"),
        "end_date": (start + dt.timedelta(days=1)).strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }


def timeline(http: httpx.Client, **params: str) -> dict[str, Any]:
    response = http.get("/v1/timeline", params={**WINDOW, **params})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["timeline"]
    return found


def seed(server: LiveServer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two hosts; alice's lease on one, bob's (with a name full of markup) on the other."""
    with client(server) as admin, client(server, ALICE) as alice, client(server, BOB) as bob:
        created(admin.post("/v1/os-hosts", json={"name": "compute-1", "gpu": "a100"}), "host")
        created(admin.post("/v1/os-hosts", json={"name": "compute-2"}), "host")
        mine = created(alice.post("/v1/leases", json=lease_body("alice-lease", 1)), "lease")
        theirs = created(bob.post("/v1/leases", json=lease_body("<b>bob</b> secret", 1)), "lease")
    return mine, theirs


def test_admin_sees_every_lease_on_its_host(live: LiveServer) -> None:
    mine, theirs = seed(live)
    with client(live) as admin:
        found = timeline(admin)
    assert found["resource_type"] == "physical:host"
    assert [r["name"] for r in found["resources"]] == ["compute-1", "compute-2"]
    assert all(r["reservable"] for r in found["resources"])
    assert {(lease["name"], lease["project_id"], lease["status"]) for lease in found["leases"]} == {
        ("alice-lease", "project-a", "PENDING"),
        ("<b>bob</b> secret", "project-b", "PENDING"),
    }
    assert len(found["bars"]) == 2
    start = int((T0 + dt.timedelta(days=1)).timestamp())
    for bar in found["bars"]:
        assert (bar["start"], bar["end"], bar["amount"]) == (start, start + 86400, 0)
        assert bar["lease"] is not None
    held = {found["leases"][b["lease"]]["id"]: b["resource"] for b in found["bars"]}
    assert set(held) == {mine["id"], theirs["id"]} and set(held.values()) == {0, 1}
    assert found["start"] == int(dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp())


def test_a_member_sees_other_projects_only_as_busy(live: LiveServer) -> None:
    mine, theirs = seed(live)
    with client(live, ALICE) as alice:
        response = alice.get("/v1/timeline", params=WINDOW)
    assert response.status_code == 200
    found = response.json()["timeline"]
    assert found["leases"] == [
        {"id": mine["id"], "name": "alice-lease", "project_id": "project-a", "status": "PENDING"}
    ]
    busy = [b for b in found["bars"] if b["lease"] is None]
    assert len(busy) == 1 and len(found["bars"]) == 2
    # Nothing of bob's lease anywhere in the answer, and no host names (admins only).
    for secret in (theirs["id"], "bob", "project-b", "compute-"):
        assert secret not in response.text
    assert {r["name"] for r in found["resources"]} == {
        f"host {r['id']}" for r in found["resources"]
    }


def test_other_resource_kinds_have_their_rows(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        created(admin.post("/v1/devices", json={"name": "gpu-0"}), "device")
        created(
            admin.post("/v1/volume-pools", json={"name": "fast", "capacity_gb": 100}), "volume_pool"
        )
        lease = {
            **lease_body("vol", 1),
            "reservations": [{"resource_type": "virtual:volume", "size_gb": 10, "amount": 2}],
        }
        created(admin.post("/v1/leases", json=lease), "lease")
        devices = timeline(admin, resource_type="device")
        pools = timeline(admin, resource_type="virtual:volume")
    assert [r["name"] for r in devices["resources"]] == ["gpu-0"] and devices["bars"] == []
    assert [r["name"] for r in pools["resources"]] == ["fast"]
    assert [b["amount"] for b in pools["bars"]] == [20]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"resource_type": "virtual:instance"}, "resource_type"),
        ({"resource_type": "<script>"}, "resource_type"),
        ({"start": "2030-01-02 00:00", "end": "2030-01-01 00:00"}, "end"),
        ({"start": "2030-01-01 00:00", "end": "2032-01-01 00:00"}, "end"),
        ({"start": "yesterday"}, "start"),
        ({"end": "soon"}, "end"),
    ],
)
def test_bad_timeline_requests_name_the_field(
    live_sqlite: LiveServer, params: dict[str, str], field: str
) -> None:
    with client(live_sqlite) as admin:
        body = assert_error(admin.get("/v1/timeline", params={**WINDOW, **params}), 400)
    assert body["error_message"].startswith(field), body


def test_a_down_host_is_not_reservable(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as admin:
        host = created(admin.post("/v1/os-hosts", json={"name": "compute-1"}), "host")
        response = admin.put(f"/v1/os-hosts/{host['id']}/health", json={"health": "down"})
        assert response.status_code == 200, response.text
        [row] = timeline(admin)["resources"]
    assert row["reservable"] is False


def test_token_mode_wants_a_token(settings: Settings, sqlite_url: str) -> None:
    with token_server(settings, sqlite_url) as server:
        member = issue(server, "alice", "project-a", ["member"])
        with client(server) as anonymous:
            assert_error(anonymous.get("/v1/timeline", params=WINDOW), 401)
            assert anonymous.get("/ui/").status_code == 200  # the page itself asks for one
        with client(server, {"X-Auth-Token": member}) as alice:
            assert timeline(alice)["bars"] == []


def test_the_page_is_served_with_a_strict_policy(live_sqlite: LiveServer) -> None:
    with client(live_sqlite) as http:
        page = http.get("/ui/")
        versions = http.get("/")
        script = http.get("/ui/app.js")
        vendor = http.get("/ui/vendor/vis-timeline-graph2d.esm.min.js")
        missing = http.get("/ui/nothing.js")
        redirect = http.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert (
        "script-src 'self';" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
    )
    assert page.headers["x-content-type-options"] == "nosniff"
    assert (
        "<script>" not in page.text
        and 'src="http' not in page.text
        and 'href="http' not in page.text
    )
    assert versions.status_code == 300 and versions.json()["versions"][0]["id"] == "v1.0"
    for asset in (script, vendor):
        assert asset.status_code == 200
        assert "javascript" in asset.headers["content-type"]
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert missing.status_code == 404 and missing.json()["error_code"] == 404
    assert redirect.status_code == 307 and redirect.headers["location"].endswith("/ui/")
