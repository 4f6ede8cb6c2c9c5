"""Lists come in pages as in OpenStack: ``limit`` (capped by ``max_page_size``), ``marker`` (the
id of the last item seen), ``sort_key`` and ``sort_dir``, in a stable order. Without ``limit``
a list Blazar has comes whole, as Blazar answers it (its client finds names in it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from climate.config import Settings
from tests.conftest import LiveServer, serve
from tests.test_auth import ALICE, BOB, CAROL_ADMIN, assert_error, client, created, lease_body

MAX_PAGE = 4


@pytest.fixture
def small_pages(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    with serve(settings.model_copy(update={"max_page_size": MAX_PAGE}), database_url) as server:
        yield server


def names(response: httpx.Response, key: str = "leases", field: str = "name") -> list[Any]:
    assert response.status_code == 200, response.text
    return [item[field] for item in response.json()[key]]


def make_leases(admin: httpx.Client, alice: httpx.Client, count: int) -> list[str]:
    created(admin.post("/v1/os-hosts", json={"name": "compute-0"}), "host")
    return [
        created(alice.post("/v1/leases", json=lease_body(f"l{i}", day=i + 1)), "lease")["id"]
        for i in range(count)
    ]


def test_leases_page_by_page_in_creation_order(small_pages: LiveServer) -> None:
    with client(small_pages, CAROL_ADMIN) as admin, client(small_pages, ALICE) as alice:
        made = make_leases(admin, alice, 5)
        seen: list[str] = []
        marker: dict[str, str] = {}
        while True:
            page = names(alice.get("/v1/leases", params={"limit": 2, **marker}), field="id")
            if not page:
                break
            assert len(page) <= 2
            seen += page
            marker = {"marker": page[-1]}
        assert seen == made


def test_over_the_cap_a_page_is_max_page_size_and_without_limit_the_list_is_whole(
    small_pages: LiveServer,
) -> None:
    with client(small_pages, CAROL_ADMIN) as admin, client(small_pages, ALICE) as alice:
        make_leases(admin, alice, MAX_PAGE + 2)
        assert len(names(alice.get("/v1/leases", params={"limit": 10**6}))) == MAX_PAGE
        every = [f"l{i}" for i in range(MAX_PAGE + 2)]
        assert names(alice.get("/v1/leases")) == every
        assert names(alice.get("/v1/leases")) == every  # the kept page, brought up to date
        more = [
            created(admin.post("/v1/os-hosts", json={"name": f"c{i}"}), "host") for i in range(5)
        ]
        hosts = names(admin.get("/v1/os-hosts"), "hosts", "hypervisor_hostname")
        assert hosts == ["compute-0"] + [h["hypervisor_hostname"] for h in more]
        allocated = admin.get("/v1/os-hosts/allocations").json()["allocations"]
        assert len(allocated) == len(more) + 1  # a row per host, every host


def test_leases_sorted_by_another_key_and_direction(small_pages: LiveServer) -> None:
    with client(small_pages, CAROL_ADMIN) as admin, client(small_pages, ALICE) as alice:
        make_leases(admin, alice, 3)
        by_name = {"sort_key": "name", "sort_dir": "desc"}
        first = names(alice.get("/v1/leases", params={**by_name, "limit": 2}), field="id")
        rest = alice.get("/v1/leases", params={**by_name, "marker": first[-1]})
        listed = names(alice.get("/v1/leases", params=by_name))
        assert listed == ["l2", "l1", "l0"]
        assert len(first) == 2 and len(names(rest)) == 1
        assert names(rest) == ["l0"]
        ends = names(alice.get("/v1/leases", params={"sort_key": "end_date"}))
        assert ends == ["l0", "l1", "l2"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"sort_dir": "up"}, "sort_dir"),
        ({"sort_key": "project_id; drop table leases"}, "sort_key"),
        ({"marker": "00000000-0000-4000-8000-000000000000"}, "marker"),
    ],
)
def test_bad_paging_parameters_are_400_naming_them(
    live: LiveServer, params: dict[str, str], field: str
) -> None:
    with client(live, ALICE) as alice:
        assert_error(alice.get("/v1/leases", params=params), 400, f"{field}:")
    with client(live, CAROL_ADMIN) as admin:
        assert_error(admin.get("/v1/os-hosts", params=params), 400, f"{field}:")


def test_another_projects_lease_is_an_unknown_marker(live: LiveServer) -> None:
    with (
        client(live, CAROL_ADMIN) as admin,
        client(live, ALICE) as alice,
        client(live, BOB) as bob,
    ):
        [theirs] = make_leases(admin, alice, 1)
        foreign = assert_error(bob.get("/v1/leases", params={"marker": theirs}), 400, "marker")
        unknown = bob.get("/v1/leases", params={"marker": "00000000-0000-4000-8000-000000000000"})
        assert foreign == unknown.json()  # nothing tells an existing lease from a missing one


def test_hosts_page_by_id_or_by_name(small_pages: LiveServer) -> None:
    with client(small_pages, CAROL_ADMIN) as admin:
        made = [
            created(admin.post("/v1/os-hosts", json={"name": name}), "host")["id"]
            for name in ("c", "a", "b")
        ]
        first = names(admin.get("/v1/os-hosts", params={"limit": 2}), "hosts", "id")
        rest = admin.get("/v1/os-hosts", params={"limit": 2, "marker": first[-1]})
        assert first + names(rest, "hosts", "id") == made
        by_name = {"sort_key": "hypervisor_hostname", "sort_dir": "desc"}
        listed = admin.get("/v1/os-hosts", params=by_name)
        assert names(listed, "hosts", "hypervisor_hostname") == ["c", "b", "a"]
        assert_error(admin.get("/v1/os-hosts", params={"marker": "999"}), 400, "marker")


def test_allocations_page_by_host(small_pages: LiveServer) -> None:
    with client(small_pages, CAROL_ADMIN) as admin, client(small_pages, ALICE) as alice:
        hosts = [
            created(admin.post("/v1/os-hosts", json={"name": f"compute-{i}"}), "host")["id"]
            for i in range(3)
        ]
        for i in range(3):
            created(alice.post("/v1/leases", json=lease_body(f"l{i}")), "lease")
        url = "/v1/os-hosts/allocations"
        first = alice.get(url, params={"limit": 2}).json()["allocations"]
        assert [a["resource_id"] for a in first] == hosts[:2]
        rest = alice.get(url, params={"marker": first[-1]["resource_id"]}).json()["allocations"]
        assert [a["resource_id"] for a in rest] == hosts[2:]
        assert all(len(a["reservations"]) == 1 for a in first + rest)
        assert_error(alice.get(url, params={"limit": "0"}), 400, "limit:")
        assert_error(alice.get(url, params={"marker": "x"}), 400, "marker:")
