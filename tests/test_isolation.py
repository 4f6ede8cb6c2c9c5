"""Project isolation over real HTTP, endpoint by endpoint: a member of project B learns nothing of
project A's leases, reservations or allocations (not even that they exist); an admin sees all.

Tokens have no HTTP endpoint (``climate token`` works on the database directly), so there is
nothing of them to isolate here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.test_auth import ALICE, BOB, CAROL_ADMIN, assert_error, client, created, ids, lease_body

SECRET_NAME = "alpha-secret-name"
MISSING = "00000000-0000-4000-8000-000000000000"


@dataclass
class World:
    server: LiveServer
    host_id: str
    lease: dict[str, Any]
    """Project A's lease."""

    @property
    def reservation_id(self) -> str:
        rid: str = self.lease["reservations"][0]["id"]
        return rid


@pytest.fixture
def world(live: LiveServer) -> World:
    with client(live, CAROL_ADMIN) as admin, client(live, ALICE) as alice:
        host = created(
            admin.post("/v1/os-hosts", json={"name": "compute-0", "gpu": "a100"}), "host"
        )
        created(admin.post("/v1/os-hosts", json={"name": "compute-1", "owner": "ops"}), "host")
        assert admin.patch("/v1/os-hosts/properties/owner", json={"private": True}).is_success
        lease = created(alice.post("/v1/leases", json=lease_body(SECRET_NAME)), "lease")
    return World(live, host["id"], lease)


def reveals_nothing(response: httpx.Response, world: World) -> None:
    assert SECRET_NAME not in response.text
    assert world.reservation_id not in response.text


def test_lists_show_only_the_callers_project(world: World) -> None:
    a_id = world.lease["id"]
    with client(world.server, BOB) as bob, client(world.server, CAROL_ADMIN) as admin:
        for params in ({}, {"project_id": "project-a"}, {"name": SECRET_NAME}, {"limit": 1000}):
            response = bob.get("/v1/leases", params=params)
            assert ids(response) == set()
            reveals_nothing(response, world)
            assert a_id not in response.text
        assert ids(admin.get("/v1/leases")) == {a_id}
        assert ids(admin.get("/v1/leases", params={"project_id": "project-a"})) == {a_id}


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("PUT", "", {"name": "stolen"}),
        ("PUT", "", {"end_date": "2999-01-01 00:00"}),
        ("DELETE", "", None),
        ("POST", "/retry", None),
        ("POST", "/force-end", {}),
    ],
)
def test_another_projects_lease_answers_exactly_like_a_missing_one(
    world: World, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    a_id = world.lease["id"]
    with client(world.server, BOB) as bob, client(world.server, ALICE) as alice:
        theirs = bob.request(method, f"/v1/leases/{a_id}{suffix}", json=body)
        missing = bob.request(method, f"/v1/leases/{MISSING}{suffix}", json=body)
        assert theirs.status_code == missing.status_code
        assert theirs.status_code in (403, 404)  # the operations are admin-only: 403 for both
        assert theirs.json() == {
            **missing.json(),
            "error_message": missing.json()["error_message"].replace(MISSING, a_id),
        }
        reveals_nothing(theirs, world)
        after = alice.get(f"/v1/leases/{a_id}").json()["lease"]
        assert (after["name"], after["status"], after["end_date"]) == (
            SECRET_NAME,
            world.lease["status"],
            world.lease["end_date"],
        )


def test_lease_reads_and_changes_are_404_not_403(world: World) -> None:
    with client(world.server, BOB) as bob:
        for method in ("GET", "PUT", "DELETE"):
            answer = bob.request(method, f"/v1/leases/{world.lease['id']}", json={"name": "x"})
            assert_error(answer, 404)


def test_names_are_per_project_so_a_name_in_use_elsewhere_gives_nothing_away(
    world: World,
) -> None:
    with client(world.server, BOB) as bob:
        mine = created(bob.post("/v1/leases", json=lease_body(SECRET_NAME, day=3)), "lease")
        assert mine["project_id"] == "project-b"


def test_allocations_show_only_the_callers_reservations(world: World) -> None:
    per_host = f"/v1/os-hosts/{world.host_id}/allocation"
    with (
        client(world.server, BOB) as bob,
        client(world.server, ALICE) as alice,
        client(world.server, CAROL_ADMIN) as admin,
    ):
        for params in (
            {},
            {"lease_id": world.lease["id"]},
            {"reservation_id": world.reservation_id},
        ):
            listed = bob.get("/v1/os-hosts/allocations", params=params)
            assert listed.status_code == 200
            assert all(a["reservations"] == [] for a in listed.json()["allocations"])
            reveals_nothing(listed, world)
            one = bob.get(per_host, params=params)
            assert one.json()["allocation"]["reservations"] == []
            reveals_nothing(one, world)

        def leases_in(response: httpx.Response, key: str) -> set[str]:
            body = response.json()[key]
            found = body if isinstance(body, list) else [body]
            return {r["lease_id"] for a in found for r in a["reservations"]}

        for who in (alice, admin):
            assert leases_in(who.get("/v1/os-hosts/allocations"), "allocations") == {
                world.lease["id"]
            }
            assert leases_in(who.get(per_host), "allocation") == {world.lease["id"]}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/os-hosts", None),
        ("GET", "/v1/os-hosts/{host}", None),
        ("POST", "/v1/os-hosts", {"name": "compute-9"}),
        ("PUT", "/v1/os-hosts/{host}", {"rack": "r9"}),
        ("DELETE", "/v1/os-hosts/{host}", None),
        ("PATCH", "/v1/os-hosts/properties/owner", {"private": False}),
        ("GET", "/v1/audit", None),
        ("GET", "/v1/audit?target_id={lease}", None),
    ],
)
def test_host_management_and_the_audit_log_are_admin_only(
    world: World, method: str, path: str, body: dict[str, Any] | None
) -> None:
    url = path.format(host=world.host_id, lease=world.lease["id"])
    with client(world.server, BOB) as bob, client(world.server, CAROL_ADMIN) as admin:
        denied = bob.request(method, url, json=body)
        assert_error(denied, 403)
        reveals_nothing(denied, world)
        if method == "GET":
            assert admin.get(url).status_code == 200


def test_audit_log_shows_admins_every_projects_changes(world: World) -> None:
    with client(world.server, CAROL_ADMIN) as admin:
        rows = admin.get("/v1/audit", params={"target_id": world.lease["id"]}).json()["audit_log"]
        assert [(r["action"], r["actor_project"]) for r in rows] == [("lease.create", "project-a")]


def test_public_host_properties_are_shown_to_every_member(world: World) -> None:
    # As in Blazar: the names and values of non-private host properties are visible to every
    # project (they describe hosts, not anyone's leases, and members need them to write
    # resource_properties queries); private ones only to admins asking with all=true.
    with client(world.server, BOB) as bob, client(world.server, CAROL_ADMIN) as admin:
        for params in ({"detail": "true"}, {"detail": "true", "all": "true"}):
            shown = bob.get("/v1/os-hosts/properties", params=params).json()
            assert shown["resource_properties"] == [
                {"property": "gpu", "private": False, "values": ["a100"]}
            ]
        everything = admin.get("/v1/os-hosts/properties", params={"all": "true"}).json()
        assert [p["property"] for p in everything["resource_properties"]] == ["gpu", "owner"]
