"""Explained refusals and counter-offers.

The planner's explanation and offers are checked against brute force on small random calendars
(the worlds of tests/test_availability.py): counts host by host, every offer placed by
admission's own rule on the same calendar, no earlier fitting start than the one offered, no
longer fitting lease than the shorter one offered. Then the service (every offer of a refusal is
admitted when posted as is) and the API over a live server (the 409 body, accepting an offer in
one call, a member sees no other project's identities).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from climate.api.parsing import parse_date
from climate.api.schemas.leases import LeaseCreate, LeaseUpdate
from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.planner.availability import (
    CounterOffer,
    HostPlacer,
    HostRequest,
    SearchRange,
    counter_offers,
)
from climate.runtime import build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService, ReservationRequest
from tests.conftest import ADMIN, ALICE, BOB, T0, LiveServer
from tests.helpers import add_hosts, host_request, hosts_of, refusal_body
from tests.test_availability import HOUR, MINUTE, PROPERTY_SETTINGS, World, queries, worlds
from tests.test_availability import T0 as W0

SHORTEST = 60.0
Requests = list[tuple[str, int, int]]


def placer(world: World, requests: Requests, within: SearchRange) -> HostPlacer:
    return HostPlacer(
        world.calendar(),
        [HostRequest(i, world.hosts(q), low, high) for i, (q, low, high) in enumerate(requests)],
        within,
    )


def fits(world: World, requests: Requests, start: float, end: float) -> bool:
    """Brute force, for requests over equal or disjoint host sets: set by set, each takes as
    many as it may of what is left, and that is at least its min."""
    left = {q: len(world.free_hosts(q, start, end)) for q, _, _ in requests}
    for query, low, high in requests:
        if left[query] < low:
            return False
        left[query] -= min(high, left[query])
    return True


def requests_over_equal_or_disjoint_hosts() -> st.SearchStrategy[Requests]:
    one = st.tuples(queries, st.integers(1, 4), st.integers(0, 2)).map(
        lambda r: (r[0], r[1], r[1] + r[2])
    )
    return st.lists(one, min_size=1, max_size=3).filter(
        lambda rs: {q for q, _, _ in rs} in ({"all"}, {"gpu"}, {"plain"}, {"gpu", "plain"})
    )


windows = st.tuples(
    st.integers(-2 * HOUR, 10 * HOUR).map(lambda s: W0 + s),
    st.sampled_from([MINUTE, 30 * MINUTE, HOUR, 3 * HOUR, 9 * HOUR]),
)


def offers_for(
    world: World, requests: Requests, start: int, length: int
) -> tuple[SearchRange, list[CounterOffer], Any]:
    within = SearchRange(start, start + 24 * HOUR + length, length, MINUTE)
    shortfalls, offers = counter_offers(
        [placer(world, requests, within)], within, start, start + length, SHORTEST
    )
    return within, offers, shortfalls


@given(world=worlds(), requests=requests_over_equal_or_disjoint_hosts(), window=windows)
@PROPERTY_SETTINGS
def test_the_reason_counts_what_brute_force_counts(
    world: World, requests: Requests, window: tuple[int, int]
) -> None:
    start, length = window
    end = start + length
    _, _, shortfalls = offers_for(world, requests, start, length)
    left = {q: world.free_hosts(q, start, end) for q, _, _ in requests}
    for k, (query, low, high) in enumerate(requests):
        s = shortfalls[k]
        matching = set(world.hosts(query).ids.tolist())
        free = world.free_hosts(query, start, end)
        busy = matching - free
        released = sorted(
            max(e for h, s0, e in world.spans if h == host and s0 < end and e > start)
            for host in busy
        )
        assert (s.index, s.min, s.max) == (k, low, high)
        assert (s.matching, s.free, list(s.released)) == (len(matching), len(free), released)
        assert s.available == len(left[query])
        assert s.fits == (len(left[query]) >= low)
        if s.rule == "too_few_free":
            assert len(free) < low <= len(matching)
            needed = low - len(free)
            assert s.enough_free_by == (released[needed - 1] if needed <= len(busy) else None)
        taken = sorted(left[query])[: min(high, len(left[query]))]
        left[query] -= set(taken)


@given(world=worlds(), requests=requests_over_equal_or_disjoint_hosts(), window=windows)
@PROPERTY_SETTINGS
def test_every_counter_offer_is_admitted_and_the_best_of_its_kind(
    world: World, requests: Requests, window: tuple[int, int]
) -> None:
    start, length = window
    end = start + length
    assume(not fits(world, requests, start, end))
    within, offers, shortfalls = offers_for(world, requests, start, length)
    kinds = [o.kind for o in offers]
    assert kinds == sorted(set(kinds), key=["later_start", "fewer_hosts", "shorter"].index)
    by_kind = {o.kind: o for o in offers}

    for offer in offers:
        # Admission's own rule, on the same calendar, with the offered counts.
        offered = [
            (q, *(offer.counts[k] if offer.counts else (low, high)))
            for k, (q, low, high) in enumerate(requests)
        ]
        assert placer(world, offered, within).place_window(offer.start, offer.end) is not None
        assert fits(world, offered, offer.start, offer.end)

    # The earliest later start: none fits on the grid before it (or at all, without one).
    later = by_kind.get("later_start")
    grid = range(within.first, within.last + 1, within.step)
    starts = [t for t in grid if fits(world, requests, t, t + length)]
    assert (later.start if later else None) == (starts[0] if starts else None)
    if later is not None:
        assert later.end - later.start == length and later.counts is None

    # The most hosts in the window: each reservation as many as are left for it.
    fewer = by_kind.get("fewer_hosts")
    if all(s.available for s in shortfalls):
        assert fewer is not None and (fewer.start, fewer.end) == (start, end)
        for (low, high), s, (_, want_low, want_high) in zip(
            fewer.counts or (), shortfalls, requests, strict=True
        ):
            assert high == min(want_high, s.available) and low == min(want_low, high)
        assert fewer.below_request == any(
            low < want for (low, _), (_, want, _) in zip(fewer.counts or (), requests, strict=True)
        )
    else:
        assert fewer is None

    # The shorter lease: no end after it fits. Fitting changes only where a span starts, so
    # trying those ends (and the minute grid) is exhaustive.
    shorter = by_kind.get("shorter")
    ends = {s for _, s, _ in world.spans} | set(range(start + MINUTE, end, MINUTE))
    fitting = [e for e in ends if start + SHORTEST <= e < end and fits(world, requests, start, e)]
    assert (shorter.end if shorter else None) == (max(fitting) if fitting else None)
    if shorter is not None:
        assert shorter.start == start and shorter.counts is None


# -- the service ---------------------------------------------------------------------------------

HOURS = dt.timedelta(hours=1)
GPU = '["==", "$gpu", "a100"]'


def refused(leases: LeaseService, *args: Any, **kw: Any) -> dict[str, Any]:
    with pytest.raises(NotEnoughCapacity) as caught:
        leases.create(ALICE, host_request(*args, **kw))
    details: dict[str, Any] = json.loads(json.dumps(refusal_body(caught.value)))  # JSON-ready
    return details


def test_a_refusal_explains_itself_and_offers_three_ways_that_fit(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 3, gpu="a100")
    add_hosts(hosts, 1, prefix="plain")
    bob = leases.create(BOB, host_request("bob-secret", T0 + 3 * HOURS, T0 + 5 * HOURS, 2, 2, GPU))

    details = refused(leases, "alice", T0 + 2 * HOURS, T0 + 4 * HOURS, 3, 3, GPU)

    [reason] = details["reason"]["reservations"]
    assert reason == {
        "index": 0,
        "resource_type": "physical:host",
        "rule": "too_few_free",
        "min": 3,
        "max": 3,
        "matching": 3,
        "free": 1,
        "available": 1,
        "busy": 2,
        "busy_until": [{"date": "2030-01-01T17:00:00.000000", "count": 2}],
        "enough_free_by": "2030-01-01T17:00:00.000000",
    }
    for secret in (bob.id, bob.name, bob.project_id, bob.reservations[0].id):
        assert secret not in json.dumps(details)
    offers = {o["kind"]: o for o in details["offers"]}
    assert list(offers) == ["later_start", "fewer_hosts", "shorter"]
    assert (
        offers["later_start"]["lease"]["start_date"],
        offers["later_start"]["below_request"],
    ) == (
        "2030-01-01T17:00:00.000000",
        False,
    )
    assert offers["later_start"]["lease"]["end_date"] == "2030-01-01T19:00:00.000000"
    fewer = offers["fewer_hosts"]
    assert fewer["below_request"] is True
    assert [(r["min"], r["max"]) for r in fewer["lease"]["reservations"]] == [(1, 1)]
    assert offers["shorter"]["lease"]["end_date"] == "2030-01-01T15:00:00.000000"

    # Each offer, posted as is, is admitted (dry runs: the calendar stays as it was).
    for offer in details["offers"]:
        body = {**offer["lease"], "dry_run": True}
        lease = leases.create(ALICE, LeaseCreate.model_validate(body).request())
        assert sum(len(r.allocations) for r in lease.reservations) >= 1
    accepted = leases.create(
        ALICE, LeaseCreate.model_validate(offers["later_start"]["lease"]).request()
    )
    assert [len(r.allocations) for r in accepted.reservations] == [3]


def test_a_lease_starting_now_is_offered_now_again(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 3)
    leases.create(BOB, host_request("bob", None, T0 + 2 * HOURS, 1))
    leases.create(BOB, host_request("bob-2", T0 + 1 * HOURS, T0 + 5 * HOURS, 1))

    details = refused(leases, "alice", None, T0 + 4 * HOURS, 2)

    offers = {o["kind"]: o["lease"] for o in details["offers"]}
    assert offers["fewer_hosts"]["start_date"] == "now"
    assert offers["shorter"] == {**offers["shorter"], "start_date": "now"}
    assert offers["shorter"]["end_date"] == "2030-01-01T13:00:00.000000"
    assert offers["later_start"]["start_date"] == "2030-01-01T14:00:00.000000"
    for body in offers.values():
        assert leases.create(
            ALICE, LeaseCreate.model_validate({**body, "dry_run": True}).request()
        ).reservations


def test_no_offer_when_nothing_matches(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    details = refused(leases, "alice", T0 + HOURS, T0 + 2 * HOURS, 1, 1, GPU)
    assert details["offers"] == []
    assert details["reason"]["reservations"][0]["rule"] == "too_few_match"


# -- over HTTP -----------------------------------------------------------------------------------

ALICE_HEADERS = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB_HEADERS = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
WIRE = "%Y-%m-%dT%H:%M:%S.%f"
START = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)


def fmt(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M")


def lease_body(name: str, start: dt.datetime, end: dt.datetime, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": fmt(start),
        "end_date": fmt(end),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "resource_properties": GPU,
            }
        ],
        "events": [],
    }


def test_a_refused_lease_gets_blazars_error_with_reason_and_offers_and_one_call_accepts(
    live: LiveServer,
) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        for name in ("g1", "g2"):
            assert http.post("/v1/os-hosts", json={"name": name, "gpu": "a100"}).status_code == 201
        bob = http.post(
            "/v1/leases",
            json=lease_body("bob-secret", START, START + dt.timedelta(hours=6), 2),
            headers=BOB_HEADERS,
        ).json()["lease"]

        response = http.post(
            "/v1/leases",
            json=lease_body("alice", START + HOURS, START + 3 * HOURS, 1),
            headers=ALICE_HEADERS,
        )

        assert response.status_code == 409
        body = response.json()
        assert body["error_code"] == 409
        assert body["error_name"] == 409
        assert body["error_message"].startswith("Not enough hosts available: 1 host(s) requested")
        for secret in (bob["id"], "bob-secret", "project-b", bob["reservations"][0]["id"]):
            assert secret not in response.text
        assert body["reason"]["reservations"][0]["busy"] == 2
        [offer] = body["offers"]  # nothing is free at the start: only a later one
        assert offer["kind"] == "later_start"

        accepted = http.post("/v1/leases", json=offer["lease"], headers=ALICE_HEADERS)

        assert accepted.status_code == 201, accepted.text
        lease = accepted.json()["lease"]
        assert lease["start_date"] == (START + 6 * HOURS).strftime("%Y-%m-%dT%H:%M:%S.%f")
        assert len(lease["reservations"][0]["allocations"]) == 1


# -- refused updates -----------------------------------------------------------------------------


def refused_update(leases: LeaseService, lease_id: str, changes: LeaseChanges) -> dict[str, Any]:
    with pytest.raises(NotEnoughCapacity) as caught:
        leases.update(ALICE, lease_id, changes)
    details: dict[str, Any] = json.loads(json.dumps(refusal_body(caught.value)))
    return details


def test_a_refused_extension_is_offered_updates_that_fit_without_its_own_hosts_in_the_way(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 3)
    lease = leases.create(ALICE, host_request("alice", T0 + HOURS, T0 + 3 * HOURS, 2))
    bob = leases.create(BOB, host_request("bob-secret", T0 + 4 * HOURS, T0 + 6 * HOURS, 2))
    original = LeaseUpdate.model_validate(
        {"start_date": "2030-01-01 13:00", "end_date": "2030-01-01 15:00"}
    ).changes()

    details = refused_update(leases, lease.id, LeaseChanges(end=T0 + 5 * HOURS))

    [reason] = details["reason"]["reservations"]
    assert (reason["rule"], reason["free"], reason["busy"]) == ("too_few_free", 1, 2)
    assert details["reason"]["start_date"] == "2030-01-01T13:00:00.000000"
    for secret in (bob.id, bob.name, bob.project_id):
        assert secret not in json.dumps(details)
    offers = {o["kind"]: o for o in details["offers"]}
    assert offers["later_start"]["lease"] == {
        "start_date": "2030-01-01T18:00:00.000000",
        "end_date": "2030-01-01T22:00:00.000000",
    }
    assert offers["fewer_hosts"]["below_request"] is True
    assert offers["fewer_hosts"]["lease"] == {
        "end_date": "2030-01-01T17:00:00.000000",
        "reservations": [{"id": lease.reservations[0].id, "min": 1, "max": 1}],
    }
    # Its own two hosts are free for it up to bob's start: counted busy, nothing would fit.
    assert offers["shorter"]["lease"] == {"end_date": "2030-01-01T16:00:00.000000"}

    for offer in details["offers"]:
        changed = leases.update(
            ALICE, lease.id, LeaseUpdate.model_validate(offer["lease"]).changes()
        )
        assert changed.end_date == parse_date("end_date", offer["lease"]["end_date"])
        assert sum(len(r.allocations) for r in changed.reservations) >= 1
        restored = leases.update(
            ALICE,
            lease.id,
            dataclasses.replace(
                original,
                reservations=[
                    ReservationRequest(None, {"min": 2, "max": 2}, lease.reservations[0].id)
                ],
            ),
        )
        assert (restored.start_date, restored.end_date) == (T0 + HOURS, T0 + 3 * HOURS)


def test_a_running_lease_is_offered_the_latest_end_its_own_hosts_allow(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1, rack="a", prefix="a")
    add_hosts(hosts, 1, rack="b", prefix="b")
    lease = leases.create(ALICE, host_request("alice", T0, T0 + HOURS))
    build_workers(ctx).manager.run_due()
    (mine,) = hosts_of(leases.get(ALICE, lease.id))
    rack = {p.name: p.value for p in hosts.get(ADMIN, str(mine)).properties}["rack"]
    # Bob needs exactly that host later on; the other one stays free all along.
    leases.create(
        BOB,
        host_request("bob", T0 + 2 * HOURS, T0 + 3 * HOURS, 1, 1, f'["==", "$rack", "{rack}"]'),
    )

    details = refused_update(leases, lease.id, LeaseChanges(end=T0 + 4 * HOURS))

    # A running lease keeps its host: the free one is no use to it, so the only offer is to
    # stop where its own host is booked.
    assert [o["kind"] for o in details["offers"]] == ["shorter"]
    [offer] = details["offers"]
    assert offer["lease"] == {"end_date": "2030-01-01T14:00:00.000000"}
    extended = leases.update(ALICE, lease.id, LeaseUpdate.model_validate(offer["lease"]).changes())
    assert (extended.status, hosts_of(extended)) == ("ACTIVE", {mine})


def test_a_refused_update_that_cannot_change_anything_gets_no_offer(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("alice", T0 + HOURS, T0 + 2 * HOURS))
    leases.create(BOB, host_request("bob", T0 + 2 * HOURS, T0 + 40 * 24 * HOURS))

    details = refused_update(leases, lease.id, LeaseChanges(end=T0 + 3 * HOURS))

    # Extending by nothing is no offer; a later start is beyond offer_search_days.
    assert details["offers"] == []
    assert details["reason"]["reservations"][0]["rule"] == "too_few_free"


def test_a_refused_update_over_http_gets_reason_and_offers_and_one_put_accepts(
    live: LiveServer,
) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        for name in ("g1", "g2"):
            assert http.post("/v1/os-hosts", json={"name": name, "gpu": "a100"}).status_code == 201
        alice = http.post(
            "/v1/leases",
            json=lease_body("alice", START, START + 2 * HOURS, 1),
            headers=ALICE_HEADERS,
        ).json()["lease"]
        bob = http.post(
            "/v1/leases",
            json=lease_body("bob-secret", START + 3 * HOURS, START + 5 * HOURS, 2),
            headers=BOB_HEADERS,
        ).json()["lease"]

        response = http.put(
            f"/v1/leases/{alice['id']}",
            json={"end_date": fmt(START + 4 * HOURS)},
            headers=ALICE_HEADERS,
        )

        assert response.status_code == 409
        body = response.json()
        assert body["error_name"] == 409
        for secret in (bob["id"], "bob-secret", "project-b"):
            assert secret not in response.text
        offers = {o["kind"]: o["lease"] for o in body["offers"]}
        assert offers["shorter"] == {"end_date": (START + 3 * HOURS).strftime(WIRE)}
        assert offers["later_start"]["start_date"] == (START + 5 * HOURS).strftime(WIRE)

        accepted = http.put(
            f"/v1/leases/{alice['id']}", json=offers["shorter"], headers=ALICE_HEADERS
        )

        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["lease"]["end_date"] == (START + 3 * HOURS).strftime(WIRE)


def test_offers_for_an_update_leave_the_calendar_in_step_with_other_processes(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("alice", T0 + HOURS, T0 + 2 * HOURS))
    leases.create(BOB, host_request("bob", T0 + 2 * HOURS, T0 + 40 * 24 * HOURS))
    moved = LeaseChanges(start=T0 + 2 * HOURS, end=T0 + 3 * HOURS)
    assert refused_update(leases, lease.id, moved)["offers"] == []  # searched, nothing tried
    # Another process (its own calendars) admits next; this one must still see that.
    other = LeaseService(build_context(settings, db, clock))
    other.create(BOB, host_request("carol", T0, T0 + HOURS / 2))

    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, host_request("late", T0, T0 + HOURS / 2))
