"""Host health and healing (docs/healing.md): a host marked down is unreservable and the
reservations on it move to a free matching host, or their lease is degraded naming what it
lacks; a host back up is reservable again and fills what degraded leases lack."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from climate import wire
from climate.backends.base import Action, Replace, Result
from climate.backends.faulty import InjectedFault
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import Assignment, HostAllocation
from climate.domain.clock import ManualClock
from climate.errors import Forbidden, InvalidInput, NotEnoughCapacity, NotFound
from climate.manager.service import Manager
from climate.planner.hosts import HostsView, replacements
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.healing import HealingService
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, T0, serve
from tests.helpers import add_hosts, host_request

CLIMATE = str(Path(sys.executable).with_name("climate"))

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)
INSTANCES = "virtual:instance"


class Recording(StandaloneBackend):
    """The standalone backend, remembering every ``Replace`` it was given."""

    def __init__(self, fail: bool = False) -> None:
        self.replaced: list[Replace] = []
        self.fail = fail

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results = super().handle(actions)
        for i, action in enumerate(actions):
            if isinstance(action, Replace):
                self.replaced.append(action)
                if self.fail:
                    results[i] = InjectedFault("the cloud refused the aggregate change")
        return results


def healing(ctx: ServiceContext, backend: StandaloneBackend) -> HealingService:
    return HealingService(ctx, Manager(ctx, backend).handlers.backend)


def allocations(ctx: ServiceContext, lease_id: str) -> list[tuple[int, dt.datetime, dt.datetime]]:
    with ctx.db.reader() as session:
        query = select(HostAllocation.host_id, HostAllocation.start_date, HostAllocation.end_date)
        rows = session.execute(query.where(HostAllocation.lease_id == lease_id))
        return sorted((h, s, e) for h, s, e in rows)


def started(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, count: int = 3
) -> tuple[list[int], str]:
    """``count`` hosts and a running one-host lease on the first."""
    ids = add_hosts(hosts, count)
    lease = leases.create(ALICE, host_request("running", None, T0 + 4 * HOUR))
    assert {a.host_id for a in lease.reservations[0].allocations} == {ids[0]}
    Manager(ctx, StandaloneBackend()).run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    return ids, lease.id


def test_a_host_down_moves_its_running_reservation_to_a_free_host_and_tells_the_backend(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids, lease_id = started(ctx, leases, hosts)
    clock.advance(10 * MINUTE)
    backend = Recording()
    report = healing(ctx, backend).mark_down(ADMIN, str(ids[0]), "nova-compute down")
    now = T0 + 10 * MINUTE
    new = report.healed[0].new_host
    assert new in ids[1:] and report.healed[0].handed_over
    # The past stays where it ran; from now on the reservation is on the new host.
    assert allocations(ctx, lease_id) == [(ids[0], T0, now), (new, now, T0 + 4 * HOUR)]
    (action,) = backend.replaced
    assert (action.old_host, action.new_host) == (str(ids[0]), str(new))
    assert action.handover.resource_ids == (str(new),)
    lease = leases.get(ALICE, lease_id)
    reservation = lease.reservations[0]
    assert (lease.degraded, reservation.resources_changed, reservation.missing_resources) == (
        False,
        True,
        False,
    )
    assert report.host.health == "down" and report.host.health_reason == "nova-compute down"
    with ctx.db.reader() as session:
        held = session.execute(
            select(Assignment.resource_id, Assignment.released_at).where(
                Assignment.lease_id == lease_id
            )
        ).all()
        actions = session.scalars(select(AuditLog.action).order_by(AuditLog.id)).all()
    assert sorted(held) == [(str(ids[0]), now), (str(new), None)]
    assert actions[-2:] == ["host.down", "lease.healed"]


def test_a_healed_running_reservation_changed_later_keeps_its_past_and_the_spare_s_start(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids, lease_id = started(ctx, leases, hosts)
    clock.advance(10 * MINUTE)
    new = healing(ctx, Recording()).mark_down(ADMIN, str(ids[0])).healed[0].new_host
    assert new is not None
    clock.advance(10 * MINUTE)
    leases.update(ALICE, lease_id, LeaseChanges(end=T0 + 5 * HOUR))
    assert allocations(ctx, lease_id) == [
        (ids[0], T0, T0 + 10 * MINUTE),
        (new, T0 + 10 * MINUTE, T0 + 5 * HOUR),
    ]


def test_a_priced_reservation_is_moved_to_the_cheapest_free_host_not_the_first_by_id(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    """The GPU host (id 2) carries a premium: a plain lease that loses host 1 goes to host 3."""
    priced = settings.model_copy(
        update={"prices": {"physical:host": "1.50", "physical:host[gpu=a100]": "4.00"}}
    )
    ctx = build_context(priced, db, clock)
    hosts, leases = HostService(ctx), LeaseService(ctx)
    for name, extra in (("plain-1", {}), ("gpu-1", {"gpu": "a100"}), ("plain-2", {})):
        hosts.create(ADMIN, name, extra)
    soon = leases.create(ALICE, host_request("soon", T0 + 30 * MINUTE, T0 + 2 * HOUR))
    assert allocations(ctx, soon.id) == [(1, T0 + 30 * MINUTE, T0 + 2 * HOUR)]
    report = healing(ctx, StandaloneBackend()).mark_down(ADMIN, "1")
    assert [s.new_host for s in report.healed] == [3]
    assert allocations(ctx, soon.id) == [(3, T0 + 30 * MINUTE, T0 + 2 * HOUR)]


def test_a_down_host_is_not_reservable(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    ids = add_hosts(hosts, 1)
    healing(ctx, StandaloneBackend()).mark_down(ADMIN, str(ids[0]))
    with pytest.raises(NotEnoughCapacity, match="no reservable host"):
        leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    assert hosts.get(ADMIN, str(ids[0])).health == "down"


def test_a_future_reservation_within_the_horizon_moves_only_its_allocation(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    ids = add_hosts(hosts, 2)
    soon = leases.create(ALICE, host_request("soon", T0 + 30 * MINUTE, T0 + 2 * HOUR))
    late = leases.create(ALICE, host_request("late", T0 + 5 * HOUR, T0 + 6 * HOUR))
    (old,) = {a.host_id for r in soon.reservations for a in r.allocations}
    (old_late,) = {a.host_id for r in late.reservations for a in r.allocations}
    assert old == old_late  # best fit put both on one host
    backend = Recording()
    report = healing(ctx, backend).mark_down(ADMIN, str(old))
    other = next(h for h in ids if h != old)
    assert [(s.lease_id, s.new_host, s.handed_over) for s in report.healed] == [
        (soon.id, other, False)
    ]
    assert backend.replaced == []  # nothing runs yet: only the allocation moved
    assert allocations(ctx, soon.id) == [(other, T0 + 30 * MINUTE, T0 + 2 * HOUR)]
    # Beyond the horizon (an hour): left on the host, which may come back before it starts.
    assert allocations(ctx, late.id) == [(old, T0 + 5 * HOUR, T0 + 6 * HOUR)]


def test_the_manager_heals_a_reservation_once_it_comes_into_the_horizon(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids = add_hosts(hosts, 2)
    late = leases.create(ALICE, host_request("late", T0 + 5 * HOUR, T0 + 6 * HOUR))
    (old,) = {a.host_id for r in late.reservations for a in r.allocations}
    healing(ctx, StandaloneBackend()).mark_down(ADMIN, str(old))
    clock.advance(4 * HOUR + 30 * MINUTE)
    Manager(ctx, StandaloneBackend()).heal()
    other = next(h for h in ids if h != old)
    assert allocations(ctx, late.id) == [(other, T0 + 5 * HOUR, T0 + 6 * HOUR)]


def test_with_no_spare_the_lease_is_degraded_naming_the_missing_host_and_heals_when_it_is_back(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids, lease_id = started(ctx, leases, hosts, count=1)
    clock.advance(10 * MINUTE)
    service = healing(ctx, Recording())
    report = service.mark_down(ADMIN, str(ids[0]))
    assert [(s.old_host, s.new_host) for s in report.healed] == [(ids[0], None)]
    lease = leases.get(ALICE, lease_id)
    assert lease.degraded and lease.reservations[0].missing_resources
    assert lease.reservations[0].missing_hosts == ["compute-0"]
    assert allocations(ctx, lease_id) == [(ids[0], T0, T0 + 10 * MINUTE)]
    # Back up: reservable at once, but it pulls no reservation back before
    # heal_interval_seconds (60 s) have passed since it went down.
    clock.advance(dt.timedelta(seconds=30))
    back = service.mark_up(ADMIN, str(ids[0]))
    assert back.host.health == "up" and back.healed == []
    assert leases.get(ALICE, lease_id).degraded
    # ...then the manager's heal pass gives it back.
    clock.advance(dt.timedelta(seconds=31))
    assert service.heal_due()
    lease = leases.get(ALICE, lease_id)
    assert not lease.degraded and not lease.reservations[0].missing_resources
    assert lease.reservations[0].missing_hosts is None
    now = T0 + 11 * MINUTE + dt.timedelta(seconds=1)
    assert allocations(ctx, lease_id) == [
        (ids[0], T0, T0 + 10 * MINUTE),
        (ids[0], now, T0 + 4 * HOUR),
    ]


def test_a_backend_that_cannot_hand_the_spare_over_leaves_the_lease_degraded(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids, lease_id = started(ctx, leases, hosts, count=2)
    clock.advance(MINUTE)
    report = healing(ctx, Recording(fail=True)).mark_down(ADMIN, str(ids[0]))
    (step,) = report.healed
    assert step.new_host is None and step.error is not None and "refused" in step.error
    assert leases.get(ALICE, lease_id).degraded
    assert allocations(ctx, lease_id) == [(ids[0], T0, T0 + MINUTE)]


def test_a_flapping_host_pulls_no_reservation_back_within_the_interval(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids, lease_id = started(ctx, leases, hosts, count=2)
    service = healing(ctx, StandaloneBackend())
    a, b = ids
    moves = []
    for _ in range(3):  # a flaps: down, up, within seconds
        clock.advance(dt.timedelta(seconds=5))
        moves += service.mark_down(ADMIN, str(a)).healed
        clock.advance(dt.timedelta(seconds=5))
        moves += service.mark_up(ADMIN, str(a)).healed
    # b fails too while a is still unsteady: the reservation does not go back to a.
    clock.advance(dt.timedelta(seconds=5))
    moves += service.mark_down(ADMIN, str(b)).healed
    assert [(m.old_host, m.new_host) for m in moves] == [(a, b), (b, None)]
    assert leases.get(ALICE, lease_id).degraded
    # Once a has stayed up for the interval, the lease gets it back: one move per interval.
    clock.advance(dt.timedelta(seconds=60))
    assert service.heal_due()
    assert not leases.get(ALICE, lease_id).degraded


def test_without_an_interval_a_flapping_host_is_used_again_at_once(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ctx.settings = ctx.settings.model_copy(update={"heal_interval_seconds": 0.0})
    ids, lease_id = started(ctx, leases, hosts, count=2)
    service = healing(ctx, StandaloneBackend())
    a, b = ids
    assert [s.new_host for s in service.mark_down(ADMIN, str(a)).healed] == [b]
    service.mark_up(ADMIN, str(a))
    assert [s.new_host for s in service.mark_down(ADMIN, str(b)).healed] == [a]
    assert not leases.get(ALICE, lease_id).degraded


def test_only_admins_mark_hosts_and_unknown_hosts_are_not_found(
    ctx: ServiceContext, hosts: HostService
) -> None:
    ids = add_hosts(hosts, 1)
    service = healing(ctx, StandaloneBackend())
    with pytest.raises(Forbidden):
        service.mark_down(ALICE, str(ids[0]))
    with pytest.raises(NotFound):
        service.mark_down(ADMIN, "999")
    with pytest.raises(InvalidInput, match="reason"):
        service.mark_down(ADMIN, str(ids[0]), "x\x1b[2J")


# -- the planner's choice, against a brute force ------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=0, max_size=8),
    st.integers(0, 5),
    st.sets(st.integers(0, 7)),
)
def test_replacements_are_the_tightest_free_usable_hosts(
    hosts: list[tuple[bool, int]], count: int, unusable: set[int]
) -> None:
    view = HostsView(
        ids=np.arange(len(hosts), dtype=np.int64),
        names=[str(i) for i in range(len(hosts))],
        free=np.array([f for f, _ in hosts], dtype=np.bool_),
        fit=np.array([fit for _, fit in hosts], dtype=np.int64),
        released=np.zeros(len(hosts)),
        detail=lambda k: pytest.fail("not needed"),
    )
    expected = sorted(
        (fit, i) for i, (free, fit) in enumerate(hosts) if free and i not in unusable
    )[:count]
    assert replacements(view, count, unusable) == [i for _, i in expected]


# -- over HTTP and the command line -----------------------------------------------------------


def _settings() -> Settings:
    return load_settings(env={}, heal_interval_seconds=0.0)


def test_over_http_a_host_down_heals_at_once_and_members_may_not_mark_hosts(
    database_url: str,
) -> None:
    with (
        serve(_settings(), database_url) as server,
        httpx.Client(base_url=f"{server.url}/v1", timeout=30) as http,
    ):
        for name in ("c1", "c2"):
            assert http.post("/os-hosts", json={"name": name}).status_code == 201
        lease = http.post(
            "/leases",
            json={
                "name": "l",
                "start_date": "now",
                "end_date": "2099-01-01 00:00",
                "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
                "events": [],
            },
        ).json()["lease"]
        host = lease["reservations"][0]["allocations"][0]["resource_id"]
        member = {"X-Project-Id": "p", "X-User-Id": "u", "X-Roles": "member"}
        refused = http.put(f"/os-hosts/{host}/health", json={"health": "down"}, headers=member)
        assert refused.status_code == 403
        assert http.put("/os-hosts/99/health", json={"health": "down"}).status_code == 404
        bad = http.put(f"/os-hosts/{host}/health", json={"health": "sideways"})
        assert bad.status_code == 400 and "health" in bad.json()["error_message"]
        deadline = time.monotonic() + 10
        while http.get(f"/leases/{lease['id']}").json()["lease"]["status"] != "ACTIVE":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.perf_counter()
        down = http.put(f"/os-hosts/{host}/health", json={"health": "down", "reason": "disk"})
        took = time.perf_counter() - began
        assert down.status_code == 200, down.text
        body = down.json()
        assert (body["health"], body["reservable"], body["health_reason"]) == (
            "down",
            False,
            "disk",
        )
        (step,) = body["healed"]
        assert step["from_host"] == host and step["to_host"] not in (None, host)
        assert step["handed_over"] is True
        assert took < 5  # healed in the request, not at a later poll
        shown = http.get(f"/os-hosts/{host}").json()["host"]
        assert (shown["reservable"], shown["health"]) == (False, "down")
        reservation = http.get(f"/leases/{lease['id']}").json()["lease"]["reservations"][0]
        assert reservation["resources_changed"] is True
        up = http.put(f"/os-hosts/{host}/health", json={"health": "up"}).json()
        assert (up["health"], up["reservable"]) == ("up", True)


def test_climate_host_down_and_up_by_name(sqlite_url: str) -> None:
    with serve(_settings(), sqlite_url) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIMATE_")}

        def climate(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [CLIMATE, *args, "--url", server.url],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )

        assert climate("host", "create", "c1").returncode == 0
        done = climate("host", "down", "c1", "--reason", "fan failure", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["health"] == "down"
        assert "fan failure" in climate("host", "show", "1").stdout
        up = climate("host", "up", "c1")
        assert up.returncode == 0 and "up" in up.stdout
        missing = climate("host", "down", "nope")
        assert missing.returncode != 0 and "no host with the id or name 'nope'" in missing.stderr


def test_a_healed_instance_reservation_shows_the_hosts_it_holds_now_not_the_failed_one(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
    ids = [hosts.create(ADMIN, f"compute-{i}", dict(size)).id for i in range(3)]
    fields = {"amount": 2, "vcpus": 4, "memory_mb": 4096, "disk_gb": 10, "affinity": False}
    reservations = [ReservationRequest(INSTANCES, fields)]
    lease = leases.create(
        ALICE, LeaseRequest(name="spread", start=None, end=T0 + 4 * HOUR, reservations=reservations)
    )
    Manager(ctx, StandaloneBackend()).run_due()
    (failing, kept) = sorted(a.host_id for a in lease.reservations[0].instance_allocations)
    clock.advance(10 * MINUTE)
    report = healing(ctx, Recording()).mark_down(ADMIN, str(failing))
    (spare,) = set(ids) - {failing, kept}
    assert [(h.old_host, h.new_host) for h in report.healed] == [(failing, spare)]
    reservation = leases.get(ALICE, lease.id).reservations[0]
    assert wire.reservation(reservation)["hosts"] == [
        {"host_id": str(h), "count": 1} for h in sorted((kept, spare))
    ]
    # What the backend is handed from now on (the lease's end) leaves the failed host out too.
    assert ctx.resource_types[INSTANCES].resource_ids(reservation) == [
        f"{h}:0" for h in sorted((kept, spare))
    ]
