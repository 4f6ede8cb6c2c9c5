"""``GET /v1/os-hosts/allocations`` and ``GET /v1/instances/allocations`` answer from the rows
each process keeps per host (``db/allocation_listing.py``) and the JSON kept per host
(``api/allocation_renders.py``): what they answer must be, byte for byte, what the database
holds, whatever happened in between and whichever process wrote it."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from climate.api.allocation_renders import AllocationRenders
from climate.backends.standalone import StandaloneBackend
from climate.config import load_settings
from climate.db import allocation_listing as listing_rows
from climate.db.allocation_listing import AllocationListing
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.errors import ClimateError
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostAllocations, HostService
from climate.services.instances import InstanceAllocationService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, BOB, T0, _reset_pg
from tests.helpers import host_request

HOUR = dt.timedelta(hours=1)
FAR = T0 + dt.timedelta(days=3650)


@dataclass(frozen=True)
class Table:
    """One allocation listing: how to book a lease it shows, and its service."""

    name: str
    book: Callable[[str, dt.datetime, dt.datetime, int], LeaseRequest]
    """A lease of (name, start, end, 1 or 2 hosts' worth)."""
    service: Callable[[ServiceContext], Any]
    """Its service: ``allocations(actor, *, start, end)`` per host."""
    extra: tuple[str, ...] = ()

    def fresh(self, service: Any, actor: Actor, start: dt.datetime | None = None) -> bytes:
        """The listing read from the database: an ``end`` far away keeps every row and leaves
        the kept rows aside."""
        return AllocationRenders(*self.extra).body(service.allocations(actor, start=start, end=FAR))

    def renders(self) -> AllocationRenders:
        return AllocationRenders(*self.extra)


def instances(name: str, start: dt.datetime, end: dt.datetime, size: int) -> LeaseRequest:
    """``size`` instances of half a host (a host of 8 vCPU, 8 GB, 100 GB)."""
    fields = {"amount": size, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10}
    return LeaseRequest(
        name=name,
        start=start,
        end=end,
        reservations=[ReservationRequest("virtual:instance", fields)],
    )


def either(name: str, start: dt.datetime, end: dt.datetime, size: int) -> LeaseRequest:
    """Whole hosts for an even lease number, instances for an odd one."""
    if int(name.removeprefix("l")) % 2:
        return instances(name, start, end, size)
    return host_request(name, start, end, size)


HOSTS = Table("hosts", lambda n, s, e, size: host_request(n, s, e, size), HostService)
INSTANCES = Table("instances", instances, InstanceAllocationService, ("count",))
HOSTS_AND_SLOTS = Table("hosts-and-slots", either, HostService)
"""Blazar's host allocations also show each instance slot on the host."""
HOST_SIZE = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}


def fresh(hosts: HostService, actor: Actor, start: dt.datetime | None = None) -> bytes:
    return HOSTS.fresh(hosts, actor, start)


def kept(
    renders: AllocationRenders, service: Any, actor: Actor, start: dt.datetime | None = None
) -> bytes:
    found: list[HostAllocations] = service.allocations(actor, start=start)
    return renders.body(found)


@contextmanager
def database(kind: str, request: pytest.FixtureRequest) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "climate.db"
            shutil.copy(request.getfixturevalue("sqlite_template"), path)
            yield f"sqlite:///{path}"
    else:
        url: str = request.getfixturevalue("pg_url")
        _reset_pg(url)
        yield url


Two = tuple[HostService, LeaseService, ManualClock]


@pytest.fixture
def two(sqlite_url: str, clock: ManualClock) -> Iterator[Two]:
    """Two hosts, the services over them and their clock."""
    db = Database(sqlite_url)
    ctx = build_context(load_settings(env={}), db, clock)
    hosts = HostService(ctx)
    for name in ("node-1", "node-2"):
        hosts.create(ADMIN, name, {"vcpus": 8})
    yield hosts, LeaseService(ctx), clock
    db.dispose()


def test_the_listing_shows_a_booking_at_once_and_forgets_a_deleted_lease(two: Two) -> None:
    hosts, leases, _ = two
    renders = AllocationRenders()
    empty = kept(renders, hosts, ADMIN)
    assert empty == b'{"allocations":[{"resource_id":"1","reservations":[]},' + (
        b'{"resource_id":"2","reservations":[]}]}'
    )
    lease = leases.create(ALICE, host_request("mine", T0 + HOUR, T0 + 2 * HOUR))
    shown = kept(renders, hosts, ADMIN)
    assert lease.id.encode() in shown
    assert shown == fresh(hosts, ADMIN)
    leases.delete(ALICE, lease.id)
    assert kept(renders, hosts, ADMIN) == empty


def test_an_allocation_leaves_the_listing_once_it_has_ended(two: Two) -> None:
    hosts, leases, clock = two
    lease = leases.create(ALICE, host_request("mine", T0 + HOUR, T0 + 2 * HOUR))
    renders = AllocationRenders()
    assert lease.id.encode() in kept(renders, hosts, ADMIN)
    clock.advance(2 * HOUR)
    assert lease.id.encode() not in kept(renders, hosts, ADMIN)
    assert kept(renders, hosts, ADMIN) == fresh(hosts, ADMIN)


def test_host_allocations_show_each_instance_slot_as_blazar_does(
    sqlite_url: str, clock: ManualClock
) -> None:
    db = Database(sqlite_url)
    ctx = build_context(load_settings(env={}), db, clock)
    hosts, leases = HostService(ctx), LeaseService(ctx)
    (host,) = [hosts.create(ADMIN, "node-1", dict(HOST_SIZE)).id]
    slots = leases.create(ALICE, instances("vms", T0 + HOUR, T0 + 2 * HOUR, 2))
    whole = leases.create(ALICE, host_request("whole", T0 + 3 * HOUR, T0 + 4 * HOUR))
    for found in (hosts.allocations(ADMIN), hosts.allocations(ADMIN, end=FAR)):
        listed = next(h for h in found if h.host_id == host)
        assert [r.lease_id for r in listed.reservations] == [slots.id, slots.id, whole.id]
    shown = AllocationRenders().body(hosts.allocations(ADMIN, host_id=str(host)))
    assert shown.count(slots.reservations[0].id.encode()) == 2
    assert b'"count"' not in shown  # Blazar's four fields, one entry per slot
    db.dispose()


def test_a_listing_from_before_what_is_kept_is_read_from_the_database(two: Two) -> None:
    hosts, leases, clock = two
    lease = leases.create(ALICE, host_request("mine", T0 + HOUR, T0 + 2 * HOUR))
    renders = AllocationRenders()
    clock.advance(3 * HOUR)
    assert lease.id.encode() not in kept(renders, hosts, ADMIN)
    earlier = kept(renders, hosts, ADMIN, start=T0)
    assert lease.id.encode() in earlier
    assert earlier == fresh(hosts, ADMIN, start=T0)


steps = st.lists(
    st.tuples(
        st.sampled_from(["create", "create", "update", "delete", "advance", "host", "unhost"]),
        st.sampled_from([ALICE, BOB]),
        st.integers(0, 7),
        st.integers(0, 12),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=14,
)
Step = tuple[str, Actor, int, int, int]


@pytest.mark.parametrize("table", [HOSTS, INSTANCES, HOSTS_AND_SLOTS], ids=lambda t: t.name)
@pytest.mark.parametrize(("kind", "examples"), [("sqlite", 25), ("postgresql", 10)])
def test_the_listing_from_kept_rows_is_the_listing_read_afresh(
    table: Table, kind: str, examples: int, request: pytest.FixtureRequest
) -> None:
    """Writes go through one process's services; the listing is asked of that process and of
    another one (its own kept rows, caught up through the allocation log), as the admin and
    as each project."""

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(history=steps)
    def check(history: list[Step]) -> None:
        with database(kind, request) as url:
            db, other_db = Database(url), Database(url)
            clock = ManualClock(T0)
            config = load_settings(env={}, event_retry_base_seconds=0.0)
            ctx = build_context(config, db, clock)
            leases, hosts = LeaseService(ctx), HostService(ctx)
            listing = table.service(ctx)
            other = table.service(build_context(config, other_db, clock))
            manager = Manager(ctx, StandaloneBackend())
            for name in ("node-a", "node-b", "node-c"):
                hosts.create(ADMIN, name, dict(HOST_SIZE))
            renders, other_renders = table.renders(), table.renders()
            made: list[tuple[Actor, str]] = []
            for i, (step, actor, pick, hours, length) in enumerate(history):
                start = clock.now() + hours * HOUR
                try:
                    if step == "create":
                        wanted = table.book(f"l{i}", start, start + length * HOUR, 1 + pick % 2)
                        made.append((actor, leases.create(actor, wanted).id))
                    elif step == "update" and made:
                        owner, lease_id = made[pick % len(made)]
                        moved = LeaseChanges(start=start, end=start + length * HOUR)
                        leases.update(owner, lease_id, moved)
                    elif step == "delete" and made:
                        owner, lease_id = made.pop(pick % len(made))
                        leases.delete(owner, lease_id)
                    elif step == "advance":
                        clock.advance(hours * HOUR)
                        manager.run_due()
                    elif step == "host":
                        hosts.create(ADMIN, f"node-{i}", dict(HOST_SIZE))
                    elif step == "unhost" and (listed := hosts.list_all(ADMIN)):
                        hosts.delete(ADMIN, str(listed[pick % len(listed)].id))
                except ClimateError:
                    pass  # refused: the listing still holds
                for who in (ADMIN, ALICE, BOB):
                    expected = table.fresh(listing, who)
                    assert kept(renders, listing, who) == expected
                    assert kept(other_renders, other, who) == expected
            db.dispose()
            other_db.dispose()

    check()


@dataclass(frozen=True)
class Row:
    host_id: int
    reservation_id: str
    lease_id: str
    project_id: str
    start_date: str = "2030-01-01T00:00:00.000000"
    end_date: str = "2031-01-01T00:00:00.000000"


NO_SESSION: Any = None
"""The listing's reads of the database are replaced below: no session is used."""


class _CatchUpWhileIterated(dict[int, list[Row]]):
    """Kept rows per host that let another request catch up while they are iterated: the
    interleaving of the race 95fbca1 fixed (a page's hosts were picked outside the guard, while
    a catching up could add hosts to this dict: "dictionary changed size during iteration")."""

    def __init__(self, kept: dict[int, list[Row]], catch_up: Callable[[], None]) -> None:
        super().__init__(kept)
        self.catch_up: Callable[[], None] | None = catch_up
        self.other: threading.Thread | None = None

    def __iter__(self) -> Iterator[int]:
        keys = super().__iter__()
        yield next(keys)
        if self.catch_up is not None:
            self.other = threading.Thread(target=self.catch_up)
            self.catch_up = None
            self.other.start()
            self.other.join(timeout=0.3)  # it waits for the guard, if the iteration holds it
        yield from keys


def test_a_page_of_hosts_is_picked_whole_while_another_request_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [Row(h, f"r{h}", f"l{h}", "p") for h in (1, 2, 3)]
    committed = [1]

    def load(_session: Any, _after: Any, reservations: Any, _hosts: Any) -> list[Row]:
        return [r for r in rows if reservations is None or r.reservation_id in reservations]

    monkeypatch.setattr(listing_rows.lease_rows, "admission_version", lambda _s: committed[0])
    monkeypatch.setattr(
        listing_rows.allocation_rows, "changes_since", lambda _s, _since, _upto: {"r9"}
    )
    listing: AllocationListing[Row] = AllocationListing(load)

    def page() -> list[int] | None:
        return listing.hosts(NO_SESSION, T0, T0, project_id=None, after=None, limit=10)

    assert page() == [1, 2, 3]

    def catch_up() -> None:
        rows.append(Row(9, "r9", "l9", "p"))
        committed[0] = 2  # another admission committed a lease on host 9
        listing.per_host(NO_SESSION, [9], T0, T0)

    kept = _CatchUpWhileIterated(listing._hosts, catch_up)
    listing._hosts = kept
    assert page() == [1, 2, 3]  # the page as it was when picked
    assert kept.other is not None
    kept.other.join()
    assert page() == [1, 2, 3, 9]
