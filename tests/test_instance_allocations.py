"""Instance allocations come a page of hosts at a time (``limit``, ``marker``), as host and item
allocations do, and one host's at ``/v1/instances/allocations/{host_id}``."""

from __future__ import annotations

import datetime as dt

import pytest

from climate.config import Settings
from climate.errors import InvalidInput, NotFound
from climate.services.context import Page, ServiceContext
from climate.services.hosts import HostService
from climate.services.instances import InstanceAllocationService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, BOB, T0, serve
from tests.test_auth import ALICE as ALICE_HEADERS
from tests.test_auth import BOB as BOB_HEADERS
from tests.test_auth import CAROL_ADMIN, assert_error, client, created, fmt
from tests.test_auth import T0 as NOW
from tests.test_instances import sized_hosts

HOUR = dt.timedelta(hours=1)


def whole_host_instances(name: str, amount: int, start: dt.datetime) -> LeaseRequest:
    """``amount`` instances as large as a sized host (8 vCPU), so each takes one host."""
    fields = {"amount": amount, "vcpus": 8, "memory_mb": 1024, "disk_gb": 10}
    return LeaseRequest(
        name=name,
        start=start,
        end=start + 2 * HOUR,
        reservations=[ReservationRequest("virtual:instance", fields)],
    )


@pytest.fixture
def allocations(ctx: ServiceContext) -> InstanceAllocationService:
    return InstanceAllocationService(ctx)


def test_allocations_page_by_host_with_instances(
    hosts: HostService, leases: LeaseService, allocations: InstanceAllocationService
) -> None:
    ids = sized_hosts(hosts, 5)
    alice = leases.create(ALICE, whole_host_instances("a", 3, T0 + HOUR))
    bob = leases.create(BOB, whole_host_instances("b", 1, T0 + HOUR))
    alices = sorted(_hosts(alice.reservations[0]))
    [bobs] = _hosts(bob.reservations[0])
    busy = sorted([*alices, bobs])
    assert len(busy) == 4

    pages = [allocations.allocations(ADMIN, page=Page(limit=3))]
    pages.append(allocations.allocations(ADMIN, page=Page(marker=str(pages[0][-1].host_id))))
    assert [[(h.host_id, len(h.reservations)) for h in page] for page in pages] == [
        [(h, 1) for h in busy[:3]],
        [(busy[3], 1)],
    ]
    assert allocations.allocations(ADMIN, page=Page(marker=str(busy[3]))) == []
    # A host without instances is in no page; filters and the project pick the hosts paged.
    idle = (set(ids) - set(busy)).pop()
    assert idle not in [h.host_id for h in allocations.allocations(ADMIN)]
    assert [h.host_id for h in allocations.allocations(ALICE, page=Page(limit=2))] == alices[:2]
    rest = allocations.allocations(ALICE, page=Page(limit=2, marker=str(alices[1])))
    assert [h.host_id for h in rest] == alices[2:]
    only_bob = allocations.allocations(ADMIN, lease_id=bob.id, page=Page(limit=1))
    assert [(h.host_id, h.reservations[0].lease_id) for h in only_bob] == [(bobs, bob.id)]


def test_one_hosts_allocations_even_none_and_unknown_host_is_not_found(
    hosts: HostService, leases: LeaseService, allocations: InstanceAllocationService
) -> None:
    used, idle = sized_hosts(hosts, 2)
    lease = leases.create(ALICE, whole_host_instances("a", 1, T0 + HOUR))
    [placed] = _hosts(lease.reservations[0])
    [one] = allocations.allocations(ALICE, host_id=str(placed))
    assert [(r.lease_id, r.count) for r in one.reservations] == [(lease.id, 1)]
    [none] = allocations.allocations(ALICE, host_id=str(idle if placed == used else used))
    assert none.reservations == []
    [hidden] = allocations.allocations(BOB, host_id=str(placed))
    assert hidden.reservations == []  # another project's instances are not shown
    [later] = allocations.allocations(ALICE, host_id=str(placed), start=T0 + 4 * HOUR)
    assert later.reservations == []
    for unknown in ("999", "x", "99999999999"):
        with pytest.raises(NotFound):
            allocations.allocations(ALICE, host_id=unknown)


@pytest.mark.parametrize("marker", ["x", "999", "-1"])
def test_a_marker_that_is_no_host_is_bad_input(
    hosts: HostService, allocations: InstanceAllocationService, marker: str
) -> None:
    sized_hosts(hosts, 1)
    with pytest.raises(InvalidInput) as refused:
        allocations.allocations(ALICE, page=Page(marker=marker))
    assert refused.value.field == "marker"


def test_http_pages_are_capped_by_max_page_size(settings: Settings, database_url: str) -> None:
    small = settings.model_copy(update={"max_page_size": 2})
    with (
        serve(small, database_url) as server,
        client(server, CAROL_ADMIN) as admin,
        client(server, ALICE_HEADERS) as alice,
    ):
        size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
        ids = [
            created(admin.post("/v1/os-hosts", json={"name": f"c{i}", **size}), "host")["id"]
            for i in range(3)
        ]
        start = NOW + dt.timedelta(days=1)
        body = {
            "name": "vms",
            "start_date": fmt(start),
            "end_date": fmt(start + 2 * HOUR),
            "reservations": [
                {
                    "resource_type": "virtual:instance",
                    "amount": 3,
                    "vcpus": 8,
                    "memory_mb": 1024,
                    "disk_gb": 10,
                    "affinity": False,
                }
            ],
            "events": [],
        }
        lease = created(alice.post("/v1/leases", json=body), "lease")
        url = "/v1/instances/allocations"
        first = alice.get(url).json()["allocations"]
        assert [a["resource_id"] for a in first] == ids[:2]  # the cap, not every host
        rest = alice.get(url, params={"marker": ids[1]}).json()["allocations"]
        assert [a["resource_id"] for a in rest] == ids[2:]
        assert [r["lease_id"] for a in first + rest for r in a["reservations"]] == [lease["id"]] * 3
        one = alice.get(f"{url}/{ids[0]}").json()["allocation"]
        assert one["resource_id"] == ids[0]
        assert [(r["lease_id"], r["count"]) for r in one["reservations"]] == [(lease["id"], 1)]
        with client(server, BOB_HEADERS) as bob:
            assert bob.get(f"{url}/{ids[0]}").json()["allocation"]["reservations"] == []
            assert bob.get(url).json()["allocations"] == []
        assert_error(alice.get(url, params={"limit": "0"}), 400, "limit")
        assert_error(alice.get(url, params={"marker": "x"}), 400, "marker")
        assert_error(alice.get(f"{url}/999"), 404, "999")


def _hosts(reservation: object) -> set[int]:
    return {a.host_id for a in getattr(reservation, "instance_allocations", [])}
