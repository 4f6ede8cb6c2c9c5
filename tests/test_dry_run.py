"""Dry runs: the answer a lease creation would give, with nothing written.

A dry run admits inside a transaction that is rolled back, so the database must be the same
byte for byte afterwards (every table, the admission lock's version included), the in-memory
calendar the same span for span, and no manager woken.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect, text

from climate.domain.clock import ManualClock
from climate.domain.status import LeaseType
from climate.errors import Conflict, NotEnoughCapacity
from climate.planner.calendar import HostSet
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0, LiveServer
from tests.helpers import add_hosts, host_request, hosts_of, queue_places, refusal_body

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


def everything(ctx: ServiceContext) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    with ctx.db.reader() as session:
        names = inspect(session.connection()).get_table_names()
        return {
            name: sorted(
                (tuple(row) for row in session.execute(text(f'SELECT * FROM "{name}"'))), key=repr
            )
            for name in names
        }


def calendar(ctx: ServiceContext, host_ids: list[int]) -> list[list[float]]:
    """The in-memory calendar's spans of these hosts, as the cache holds them."""
    cache = ctx.resource_types["physical:host"].calendar  # type: ignore[attr-defined]
    with ctx.db.reader() as session, cache.reading(session) as held:
        found = held.spans_of(HostSet((h, str(h)) for h in host_ids), -1e12, 1e12)
        return [array.tolist() for array in found]


def dry(request: Any) -> Any:
    return dataclasses.replace(request, dry_run=True)


def test_a_dry_run_answers_the_lease_and_changes_nothing(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    woken: list[dt.datetime] = []
    ctx.wake_manager = woken.append
    ids = add_hosts(hosts, 3)
    leases.create(BOB, host_request("bob", T0 + HOUR, T0 + 3 * HOUR, 1))
    woken.clear()
    before, cached = everything(ctx), calendar(ctx, ids)

    answer = leases.create(ALICE, dry(host_request("alice", T0 + 2 * HOUR, T0 + 4 * HOUR, 2)))

    assert answer.status == "PENDING" and answer.name == "alice"
    assert len(hosts_of(answer)) == 2
    assert [e.event_type for e in answer.events] == ["start_lease", "before_end_lease", "end_lease"]
    assert everything(ctx) == before
    assert calendar(ctx, ids) == cached
    assert woken == []
    # What it answered is what admission then does.
    real = leases.create(ALICE, host_request("alice", T0 + 2 * HOUR, T0 + 4 * HOUR, 2))
    assert hosts_of(real) == hosts_of(answer)
    assert woken == [T0 + 2 * HOUR]


def test_a_refused_dry_run_explains_and_changes_nothing(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    ids = add_hosts(hosts, 2)
    leases.create(BOB, host_request("bob", T0 + HOUR, T0 + 3 * HOUR, 2))
    before, cached = everything(ctx), calendar(ctx, ids)

    with pytest.raises(NotEnoughCapacity) as refused:
        leases.create(ALICE, dry(host_request("alice", T0 + 2 * HOUR, T0 + 4 * HOUR, 1)))

    [offer] = refusal_body(refused.value)["offers"]
    assert offer["lease"]["start_date"] == "2030-01-01T15:00:00.000000"
    assert everything(ctx) == before
    assert calendar(ctx, ids) == cached


def test_a_dry_run_of_a_name_in_use_is_refused_like_the_real_thing(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    leases.create(ALICE, host_request("alice", T0 + HOUR, T0 + 3 * HOUR, 1))
    with pytest.raises(Conflict, match="already exists"):
        leases.create(ALICE, dry(host_request("alice", T0 + 5 * HOUR, T0 + 6 * HOUR, 1)))


def waiting_kind(request: Any, kind: LeaseType, **more: Any) -> Any:
    """``request`` as a lease of ``kind`` starting now (a best-effort one hunts for a day)."""
    if kind == LeaseType.BEST_EFFORT:
        more.setdefault("deadline", T0 + 24 * HOUR)
    return dataclasses.replace(request, start=None, lease_type=kind, **more)


@pytest.mark.parametrize("kind", [LeaseType.RETRY, LeaseType.BEST_EFFORT])
def test_a_dry_run_of_a_waiting_type_that_fits_answers_it_admitted_and_changes_nothing(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, kind: LeaseType
) -> None:
    woken: list[dt.datetime] = []
    ctx.wake_manager = woken.append
    ids = add_hosts(hosts, 2)
    leases.create(BOB, host_request("bob", None, T0 + 3 * HOUR, 1))
    woken.clear()
    before, cached = everything(ctx), calendar(ctx, ids)

    trial = leases.dry_run(ALICE, waiting_kind(host_request("alice", None, T0 + HOUR), kind))

    assert (trial.lease.status, trial.lease.lease_type, trial.queue_position) == (
        "PENDING",
        kind,
        None,
    )
    assert len(hosts_of(trial.lease)) == 1
    assert everything(ctx) == before
    assert calendar(ctx, ids) == cached
    assert woken == []


@pytest.mark.parametrize("kind", [LeaseType.RETRY, LeaseType.BEST_EFFORT])
def test_a_dry_run_of_a_waiting_type_that_does_not_fit_answers_where_it_would_wait(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    clock: ManualClock,
    kind: LeaseType,
) -> None:
    woken: list[dt.datetime] = []
    ctx.wake_manager = woken.append
    ids = add_hosts(hosts, 1)
    leases.create(BOB, host_request("bob", None, T0 + 3 * HOUR, 1))
    queued = leases.create(BOB, waiting_kind(host_request("bob-2", None, T0 + HOUR), kind))
    assert queued.status == "IN_PROGRESS"
    clock.set(T0 + MINUTE)  # asked later: behind bob-2 at the same priority
    woken.clear()
    before, cached = everything(ctx), calendar(ctx, ids)

    behind = leases.dry_run(ALICE, waiting_kind(host_request("alice", None, T0 + HOUR), kind))
    ahead = leases.dry_run(
        ADMIN, waiting_kind(host_request("admin", None, T0 + HOUR), kind, priority=5)
    )

    assert behind.lease.status == "IN_PROGRESS"
    assert behind.lease.status_reason is not None
    assert behind.lease.status_reason.startswith("Not enough hosts available")
    assert hosts_of(behind.lease) == set()
    assert (behind.queue_position, ahead.queue_position) == (2, 1)
    assert everything(ctx) == before
    assert calendar(ctx, ids) == cached
    assert woken == []
    assert queue_places(leases) == {queued.id: 1}


# -- over HTTP -----------------------------------------------------------------------------------

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
START = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)


def body(name: str, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": START.strftime("%Y-%m-%d %H:%M"),
        "end_date": (START + HOUR).strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": count, "max": count}],
        "events": [],
    }


def test_dry_run_over_http_in_the_query_or_the_body(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/os-hosts", json={"name": "c1"}).status_code == 201

        by_query = http.post(
            "/v1/leases", json=body("a", 1), params={"dry_run": "true"}, headers=MEMBER
        )
        by_body = http.post("/v1/leases", json={**body("a", 1), "dry_run": True}, headers=MEMBER)
        too_many = http.post("/v1/leases", json=body("b", 2), params={"dry_run": "1"})
        bad = http.post("/v1/leases", json=body("a", 1), params={"dry_run": "maybe"})

        for answer in (by_query, by_body):
            assert answer.status_code == 200, answer.text
            assert answer.json()["dry_run"] is True
            [reservation] = answer.json()["lease"]["reservations"]
            assert len(reservation["allocations"]) == 1
        assert too_many.status_code == 409 and too_many.json()["reason"]
        assert bad.status_code == 400 and bad.json()["error_message"].startswith("dry_run:")
        assert http.get("/v1/leases").json()["leases"] == []
        assert http.get("/v1/audit", params={"action": "lease.create"}).json()["audit_log"] == []
        created = http.post("/v1/leases", json=body("a", 1), headers=MEMBER)
        assert created.status_code == 201 and "dry_run" not in created.json()


def test_dry_run_of_a_retry_lease_over_http_answers_its_place_in_the_queue(
    live: LiveServer,
) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/os-hosts", json={"name": "c1"}).status_code == 201
        taken = {**body("taken", 1), "start_date": "now"}
        assert http.post("/v1/leases", json=taken).status_code == 201
        retry = {**body("a", 1), "start_date": "now", "lease_type": "retry"}

        answer = http.post("/v1/leases", json=retry, params={"dry_run": "true"}, headers=MEMBER)

        assert answer.status_code == 200, answer.text
        assert answer.json()["dry_run"] is True
        lease = answer.json()["lease"]
        assert (lease["status"], lease["queue_position"]) == ("IN_PROGRESS", 1)
        assert lease["status_reason"].startswith("Not enough hosts available")
        assert http.get("/v1/leases", headers=MEMBER).json()["leases"] == []
