"""Availability search across resource types: whole hosts, instances packed onto hosts, items
(floating IPs, devices) and volume GB, in one request.

The planner is checked against brute force on small random mixed calendars: every returned
window fits by each type's own capacity rule (checked instant by instant) and no earlier fitting
start on the grid was missed. Then the service and the API over a live server: a member's mixed
search names nobody else, admission grants what was offered, a timeline per type, counter-offers
for an instance lease, and 400s naming the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from climate.api.app import create_app
from climate.api.openapi import document
from climate.api.schemas.leases import LeaseCreate
from climate.errors import NotEnoughCapacity
from climate.planner.availability import (
    HostPlacer,
    HostRequest,
    Placer,
    SearchRange,
    Window,
    counter_offers,
    earliest,
)
from climate.planner.calendar import Calendar, HostSet, Span
from climate.planner.capacity_search import StoragePool, VolumePlacer, VolumeRequest
from climate.planner.instance_search import (
    ComputePlacer,
    InstanceHost,
    InstanceRequest,
    InstanceSpace,
)
from climate.planner.instances import Size
from climate.resources.items import FLOATING_IPS
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.items import ItemService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from climate.services.volume_pools import VolumePoolService
from tests.conftest import ADMIN, ALICE, BOB, T0, LiveServer
from tests.helpers import refusal_body
from tests.test_availability import (
    HOUR,
    MINUTE,
    PROPERTY_SETTINGS,
    assert_nothing_missed,
    grid_points,
)
from tests.test_availability import T0 as W0

Interval = tuple[float, float]


def overlaps(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@dataclass(frozen=True)
class Machine:
    """A host: its size, when it is reserved whole, and the instances on it."""

    capacity: Size
    gpu: bool
    whole: tuple[Interval, ...]
    uses: tuple[tuple[float, float, Size], ...]


@dataclass(frozen=True)
class Mixed:
    machines: tuple[Machine, ...]
    """Host ids 1..n."""
    addresses: tuple[tuple[Interval, ...], ...]
    """Per floating IP (ids 101..), when it is held."""
    pools: tuple[tuple[int, tuple[tuple[float, float, int], ...]], ...]
    """Per volume pool (ids 201..): capacity and what is held."""

    def host_calendar(self) -> Calendar:
        spans = []
        for h, m in enumerate(self.machines, 1):
            spans += [Span(h, s, e, f"w{h}-{k}") for k, (s, e) in enumerate(m.whole)]
            spans += [Span(h, s, e, f"instances:{h}") for s, e in merged(m.uses)]
        return Calendar.of(spans)

    def address_calendar(self) -> Calendar:
        return Calendar.of(
            Span(101 + i, s, e, f"f{i}-{k}")
            for i, held in enumerate(self.addresses)
            for k, (s, e) in enumerate(held)
        )

    def gpu_hosts(self) -> HostSet:
        return HostSet((h, f"h{h}") for h, m in enumerate(self.machines, 1) if m.gpu)

    def plain_hosts(self) -> frozenset[int]:
        return frozenset(h for h, m in enumerate(self.machines, 1) if not m.gpu)

    def space(self, hosts: frozenset[int]) -> InstanceSpace:
        """As ``services.placing.instance_space`` reads it for instances over ``hosts``."""
        chosen = [(h, m) for h, m in enumerate(self.machines, 1) if h in hosts]
        return InstanceSpace.of(
            [InstanceHost(h, f"h{h}", m.capacity) for h, m in chosen],
            [(h, s, e) for h, m in chosen for s, e in m.whole],
            [(h, s, e, u) for h, m in chosen for s, e, u in m.uses],
        )

    def storage(self) -> list[StoragePool]:
        return [
            StoragePool(201 + i, f"p{i}", cap, held) for i, (cap, held) in enumerate(self.pools)
        ]

    # -- brute force ---------------------------------------------------------------------------

    def whole_free(self, h: int, window: Interval) -> bool:
        m = self.machines[h - 1]
        return not any(overlaps(w, window) for w in m.whole) and not any(
            overlaps((s, e), window) for s, e, _ in m.uses
        )

    def room(
        self, h: int, size: Size, window: Interval, extra: list[tuple[float, float, Size]]
    ) -> int:
        """The most instances of ``size`` host ``h`` holds at every instant of the window."""
        m = self.machines[h - 1]
        if any(overlaps(w, window) for w in m.whole):
            return 0
        uses = [u for u in (*m.uses, *extra) if overlaps((u[0], u[1]), window)]
        instants = {window[0], *(s for s, _, _ in uses if s > window[0])}
        most = 10**9
        for t in instants:
            used = [sum(u.as_tuple()[k] for s, e, u in uses if s <= t < e) for k in range(3)]
            for k in range(3):
                want = size.as_tuple()[k]
                if want:
                    most = min(most, (m.capacity.as_tuple()[k] - used[k]) // want)
        return max(most, 0)

    def address_free(self, i: int, window: Interval) -> bool:
        return not any(overlaps(w, window) for w in self.addresses[i - 101])

    def pool_free(self, i: int, window: Interval, extra: list[tuple[float, float, int]]) -> int:
        cap, held = self.pools[i - 201]
        uses = [u for u in (*held, *extra) if overlaps((u[0], u[1]), window)]
        instants = {window[0], *(s for s, _, _ in uses if s > window[0])}
        return cap - max(sum(g for s, e, g in uses if s <= t < e) for t in instants)


def merged(uses: tuple[tuple[float, float, Size], ...]) -> list[Interval]:
    found: list[list[float]] = []
    for s, e, _ in sorted(uses, key=lambda u: u[0]):
        if found and s <= found[-1][1]:
            found[-1][1] = max(found[-1][1], e)
        else:
            found.append([s, e])
    return [(s, e) for s, e in found]


sizes = st.builds(Size, st.integers(1, 2), st.integers(1, 2), st.integers(0, 1))
lengths = st.sampled_from([10, 45, 60, 180, 600]).map(lambda m: m * MINUTE)
gaps = st.sampled_from([0, 0, 5, 30, 90, 240]).map(lambda m: m * MINUTE)


@st.composite
def machines(draw: st.DrawFn, gpu: bool) -> Machine:
    capacity = draw(st.builds(Size, st.integers(2, 4), st.integers(2, 4), st.integers(1, 3)))
    cursor = W0 - draw(st.integers(0, 4)) * HOUR
    whole: list[Interval] = []
    uses: list[tuple[float, float, Size]] = []
    for _ in range(draw(st.integers(0, 4))):
        cursor += draw(gaps)
        length = draw(lengths)
        if not gpu and draw(st.booleans()):
            # A stretch of instances whose sizes add up to at most the host's: always within it.
            left = list(capacity.as_tuple())
            for _ in range(draw(st.integers(1, 3))):
                size = draw(sizes)
                if any(size.as_tuple()[k] > left[k] for k in range(3)):
                    break
                left = [left[k] - size.as_tuple()[k] for k in range(3)]
                offset = draw(st.sampled_from([0, 0, 5, 20])) * MINUTE
                inner = draw(st.sampled_from([5, 30, 60])) * MINUTE
                uses.append((cursor + offset, min(cursor + offset + inner, cursor + length), size))
            uses = [u for u in uses if u[0] < u[1]]
        else:
            whole.append((cursor, cursor + length))
        cursor += length
    return Machine(capacity, gpu, tuple(whole), tuple(uses))


def holdings(draw: st.DrawFn, count: int) -> tuple[Interval, ...]:
    cursor = W0 - draw(st.integers(0, 4)) * HOUR
    found = []
    for _ in range(count):
        cursor += draw(gaps)
        length = draw(lengths)
        found.append((cursor, cursor + length))
        cursor += length
    return tuple(found)


@st.composite
def worlds(draw: st.DrawFn) -> Mixed:
    hosts = [draw(machines(True)) for _ in range(draw(st.integers(0, 3)))]
    hosts += [draw(machines(False)) for _ in range(draw(st.integers(1, 3)))]
    addresses = tuple(
        holdings(draw, draw(st.integers(0, 3))) for _ in range(draw(st.integers(1, 3)))
    )
    pools = []
    for _ in range(draw(st.integers(1, 2))):
        capacity = draw(st.sampled_from([10, 20, 50]))
        held = [
            (s, e, draw(st.integers(1, capacity // 2)))
            for s, e in holdings(draw, draw(st.integers(0, 3)))
        ]
        # Two streams of at most half the capacity each: never over it.
        held += [
            (s, e, draw(st.integers(1, capacity // 2)))
            for s, e in holdings(draw, draw(st.integers(0, 2)))
        ]
        pools.append((capacity, tuple(held)))
    return Mixed(tuple(hosts), addresses, tuple(pools))


@dataclass(frozen=True)
class Ask:
    """A mixed request: whole gpu hosts (min, max), instances on plain hosts, floating IPs
    (each its amount), one volume (GB); in this order in the request."""

    hosts: tuple[int, int] | None
    instances: tuple[Size, int, bool | None] | None
    addresses: tuple[int, ...]
    volume: int | None


asks = st.builds(
    Ask,
    st.none() | st.tuples(st.integers(1, 2), st.integers(0, 1)).map(lambda r: (r[0], r[0] + r[1])),
    st.none() | st.tuples(sizes, st.integers(1, 3), st.sampled_from([None, True, False])),
    st.lists(st.integers(1, 2), max_size=2).map(tuple) | st.just(()),
    st.none() | st.sampled_from([5, 10, 25]),
)


searches = st.builds(
    lambda offset, length, duration, step: SearchRange(
        W0 + offset, W0 + offset + length, duration, step
    ),
    offset=st.integers(-2 * HOUR, 6 * HOUR),
    length=st.integers(4 * HOUR, 30 * HOUR),
    duration=st.sampled_from([1, 15 * MINUTE, HOUR, 3 * HOUR]),
    step=st.sampled_from([1 * MINUTE, 15 * MINUTE, HOUR]),
)


def placers_for(world: Mixed, ask: Ask, search: SearchRange) -> list[Placer]:
    """As ``services.placing`` builds them."""
    index = 0
    found: list[Placer] = []
    hosts, instances = [], []
    if ask.hosts is not None:
        hosts.append(HostRequest(index, world.gpu_hosts(), *ask.hosts))
        index += 1
    if ask.instances is not None:
        size, amount, affinity = ask.instances
        instances.append(InstanceRequest(index, world.plain_hosts(), size, amount, affinity))
        index += 1
    if instances:
        found.append(
            ComputePlacer(
                world.host_calendar(), hosts, world.space(world.plain_hosts()), instances, search
            )
        )
    elif hosts:
        found.append(HostPlacer(world.host_calendar(), hosts, search))
    if ask.addresses:
        pool = HostSet((101 + i, f"10.0.0.{i}") for i in range(len(world.addresses)))
        requests = [
            HostRequest(index + k, pool, n, n, reducible=False) for k, n in enumerate(ask.addresses)
        ]
        found.append(HostPlacer(world.address_calendar(), requests, search))
        index += len(ask.addresses)
    if ask.volume is not None:
        ids = tuple(201 + i for i in range(len(world.pools)))
        found.append(VolumePlacer(world.storage(), [VolumeRequest(index, ids, ask.volume)], search))
    return found


def fits(world: Mixed, ask: Ask, window: Interval) -> bool:
    """Brute force, instant by instant, type by type (the types here share no resource)."""
    if ask.hosts is not None:
        free = [h for h in world.gpu_hosts().ids.tolist() if world.whole_free(h, window)]
        if len(free) < ask.hosts[0]:
            return False
    if ask.instances is not None:
        size, amount, affinity = ask.instances
        room = [world.room(h, size, window, []) for h in sorted(world.plain_hosts())]
        most = {None: sum(room), True: max(room, default=0), False: sum(r > 0 for r in room)}
        if most[affinity] < amount:
            return False
    left = sum(world.address_free(101 + i, window) for i in range(len(world.addresses)))
    for amount in ask.addresses:
        if left < amount:
            return False
        left -= amount
    if ask.volume is not None:
        best = max(world.pool_free(201 + i, window, []) for i in range(len(world.pools)))
        if best < ask.volume:
            return False
    return True


def check_window(world: Mixed, ask: Ask, window: Window, search: SearchRange) -> None:
    """Every reservation gets what its type's rule allows in the window, nothing twice."""
    assert search.start <= window.start and window.end <= search.end
    assert window.start % search.step == 0 and window.end - window.start == search.duration
    span = (float(window.start), float(window.end))
    placed = iter(window.placements)
    if ask.hosts is not None:
        p = next(placed)
        free = {h for h in world.gpu_hosts().ids.tolist() if world.whole_free(h, span)}
        assert set(p.resources) <= free and len(p.resources) == min(ask.hosts[1], len(free))
    if ask.instances is not None:
        size, amount, affinity = ask.instances
        p = next(placed)
        assert set(p.resources) <= world.plain_hosts() and sum(p.quantities) == amount
        for host, count in zip(p.resources, p.quantities, strict=True):
            assert 1 <= count <= world.room(host, size, span, [])
        if affinity is not None:
            assert len(p.resources) == (1 if affinity else amount)
    taken: set[int] = set()
    for amount in ask.addresses:
        p = next(placed)
        assert len(set(p.resources)) == amount and not taken & set(p.resources)
        assert all(world.address_free(i, span) for i in p.resources)
        taken |= set(p.resources)
    if ask.volume is not None:
        p = next(placed)
        assert p.quantities == (ask.volume,)
        assert world.pool_free(p.resources[0], span, []) >= ask.volume
    assert next(placed, None) is None


def openings(world: Mixed, ask: Ask, search: SearchRange) -> list[int]:
    """The range's first start, and each grid point just after a busy span or use ends on a
    resource the request could use."""
    ends: set[float] = set()
    for m in world.machines:
        if (ask.hosts is not None and m.gpu) or (ask.instances is not None and not m.gpu):
            ends |= {e for _, e in m.whole} | {e for _, e, _ in m.uses}
    if ask.addresses:
        ends |= {e for held in world.addresses for _, e in held}
    if ask.volume is not None:
        ends |= {e for _, held in world.pools for _, e, _ in held}
    starts = {search.first, *(-(-e // search.step) * search.step for e in ends)}
    return sorted(int(t) for t in starts if search.first <= t <= search.last)


@given(world=worlds(), ask=asks, within=searches, limit=st.integers(1, 4))
@settings(max_examples=300, deadline=None)
def test_a_mixed_request_gets_exactly_the_earliest_windows_where_every_type_fits(
    world: Mixed, ask: Ask, within: SearchRange, limit: int
) -> None:
    if ask == Ask(None, None, (), None):
        ask = Ask(None, (Size(1, 1, 0), 1, None), (), None)
    found = earliest(placers_for(world, ask, within), within, limit)
    starts = [w.start for w in found]

    def fitting(t: int) -> bool:
        return fits(world, ask, (float(t), float(t + within.duration)))

    assert starts == [t for t in openings(world, ask, within) if fitting(t)][:limit]
    assert_nothing_missed(starts, [t for t in grid_points(within) if fitting(t)], within)
    for window in found:
        check_window(world, ask, window, within)


@given(
    world=worlds(),
    low=st.integers(1, 2),
    size=sizes,
    amount=st.integers(1, 3),
    affinity=st.sampled_from([None, True, False]),
    hosts_first=st.booleans(),
    within=searches,
)
@PROPERTY_SETTINGS
def test_whole_hosts_and_instances_over_the_same_hosts_never_share_one(
    world: Mixed,
    low: int,
    size: Size,
    amount: int,
    affinity: bool | None,
    hosts_first: bool,
    within: SearchRange,
) -> None:
    every = HostSet((h, f"h{h}") for h in range(1, len(world.machines) + 1))
    ids = frozenset(every.ids.tolist())
    hosts = HostRequest(0 if hosts_first else 1, every, low, low)
    instances = InstanceRequest(1 if hosts_first else 0, ids, size, amount, affinity)
    placer = ComputePlacer(world.host_calendar(), [hosts], world.space(ids), [instances], within)
    for window in earliest([placer], within, 3):
        span = (float(window.start), float(window.end))
        whole, packed = window.placements[hosts.index], window.placements[instances.index]
        assert not set(whole.resources) & set(packed.resources)
        assert all(world.whole_free(h, span) for h in whole.resources)
        assert len(whole.resources) == low and sum(packed.quantities) == amount
        for host, count in zip(packed.resources, packed.quantities, strict=True):
            assert count <= world.room(host, size, span, [])


def most_instances(world: Mixed, ask: Ask, window: Interval) -> int:
    """Brute force: how many instances of the ask's size fit in the window, by its affinity."""
    assert ask.instances is not None
    size, _, affinity = ask.instances
    room = [world.room(h, size, window, []) for h in sorted(world.plain_hosts())]
    return {None: sum(room), True: max(room, default=0), False: sum(r > 0 for r in room)}[affinity]


@given(
    world=worlds(),
    ask=asks,
    start=st.integers(-2 * HOUR, 8 * HOUR).map(lambda s: W0 + s),
    length=st.sampled_from([MINUTE, 30 * MINUTE, HOUR, 3 * HOUR]),
)
@PROPERTY_SETTINGS
def test_counter_offers_for_a_mixed_request_fit_and_are_the_best_of_their_kind(
    world: Mixed, ask: Ask, start: int, length: int
) -> None:
    if ask == Ask(None, None, (), None):
        ask = Ask(None, (Size(1, 1, 0), 2, None), (), None)
    end = start + length
    assume(not fits(world, ask, (start, end)))
    within = SearchRange(start, start + 24 * HOUR + length, length, MINUTE)
    shortfalls, offers = counter_offers(
        placers_for(world, ask, within), within, start, end, float(MINUTE)
    )
    by_kind = {o.kind: o for o in offers}

    def counted(counts: tuple[tuple[int, int], ...] | None) -> Ask:
        """The ask with an offer's counts (hosts' min..max, instances' amount)."""
        if counts is None:
            return ask
        k = 0
        hosts, instances = ask.hosts, ask.instances
        if hosts is not None:
            hosts, k = counts[k], k + 1
        if instances is not None:
            instances, k = (instances[0], counts[k][1], instances[2]), k + 1
        return dataclasses.replace(ask, hosts=hosts, instances=instances)

    for offer in offers:
        assert fits(world, counted(offer.counts), (offer.start, offer.end)), offer

    later = by_kind.get("later_start")
    fitting = [t for t in grid_points(within) if fits(world, ask, (t, t + length))]
    assert (later.start if later else None) == (fitting[0] if fitting else None)

    fewer = by_kind.get("fewer_hosts")
    cut_only_hosts_and_instances = all(s.fits or s.reducible for s in shortfalls) and all(
        s.available for s in shortfalls
    )
    assert (fewer is not None) == cut_only_hosts_and_instances
    if fewer is not None and ask.instances is not None:
        k = 0 if ask.hosts is None else 1
        most = most_instances(world, ask, (start, end))
        assert fewer.counts is not None
        assert fewer.counts[k] == (min(most, ask.instances[1]),) * 2

    shorter = by_kind.get("shorter")
    ends = {float(e) for e in range(start + MINUTE, end, MINUTE)}
    ends |= {s for m in world.machines for s, _ in m.whole} | {
        s for m in world.machines for s, _, _ in m.uses
    }
    ends |= {s for held in world.addresses for s, _ in held}
    ends |= {s for _, held in world.pools for s, _, _ in held}
    longest = [e for e in ends if start + MINUTE <= e < end and fits(world, ask, (start, e))]
    assert (shorter.end if shorter else None) == (max(longest) if longest else None)


# -- the service and the API ---------------------------------------------------------------------

ALICE_HEADERS = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB_HEADERS = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
DAY = dt.timedelta(days=1)
HOURS = dt.timedelta(hours=1)
START = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + 2 * DAY
SIZE = {"vcpus": 4, "memory_mb": 4096, "disk_gb": 10}


def fmt(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M")


def wire_date(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")


def instances(amount: int, **extra: Any) -> dict[str, Any]:
    return {"resource_type": "virtual:instance", "amount": amount, **SIZE, **extra}


def addresses(amount: int) -> dict[str, Any]:
    return {"resource_type": "virtual:floatingip", "network_id": "ext-net", "amount": amount}


def volume(size_gb: int, **extra: Any) -> dict[str, Any]:
    return {"resource_type": "virtual:volume", "size_gb": size_gb, **extra}


def assert_documented(live: LiveServer, template: str, method: str, answer: Any) -> None:
    """The answer matches the OpenAPI document's 200 response for the operation."""
    spec = document(create_app(live.ctx))
    responses = spec["paths"][template][method]["responses"]
    schema = {**responses["200"]["content"]["application/json"]["schema"], **spec}
    errors = [str(e) for e in jsonschema_rs.validator_for(schema).iter_errors(answer)]
    assert not errors, errors[:3]


def inventory(http: httpx.Client) -> None:
    """Two hosts of 8 vCPUs (two instances of SIZE each), two floating IPs, a 100 GB pool and
    a device."""
    for name in ("c0", "c1"):
        size = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100}
        assert http.post("/v1/os-hosts", json={"name": name, **size}).status_code == 201
    for address in ("172.24.4.10", "172.24.4.11"):
        fip = {"floating_network_id": "ext-net", "floating_ip_address": address}
        assert http.post("/v1/floatingips", json=fip).status_code == 201
    pool = {"name": "ssd", "capacity_gb": 100}
    assert http.post("/v1/volume-pools", json=pool).status_code == 201
    assert http.post("/v1/devices", json={"name": "gpu-0"}).status_code == 201


def bob_lease(http: httpx.Client) -> dict[str, Any]:
    """Bob holds both hosts' instance room, one address and 80 GB for the first day."""
    body = {
        "name": "bob-secret",
        "start_date": fmt(START),
        "end_date": fmt(START + DAY),
        "reservations": [instances(4), addresses(1), volume(80)],
        "events": [],
    }
    created = http.post("/v1/leases", json=body, headers=BOB_HEADERS)
    assert created.status_code == 201, created.text
    lease: dict[str, Any] = created.json()["lease"]
    return lease


def test_a_member_searches_instances_addresses_and_a_volume_at_once_and_gets_them(
    live: LiveServer,
) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        inventory(http)
        bob = bob_lease(http)
        ask = {
            "reservations": [instances(3), addresses(2), volume(25, amount=2)],
            "duration": "02:00",
            "search_start": fmt(START),
            "search_end": fmt(START + 3 * DAY),
            "limit": 2,
        }

        response = http.post("/v1/availability", json=ask, headers=ALICE_HEADERS)

        assert response.status_code == 200, response.text
        secrets = [bob["id"], bob["name"], "project-b", "bob"]
        secrets += [r["id"] for r in bob["reservations"]]
        for secret in secrets:
            assert secret not in response.text
        assert_documented(live, "/v1/availability", "post", response.json())
        windows = response.json()["windows"]
        # Everything frees when Bob's lease ends, not before (and nothing frees after that).
        assert [w["start_date"] for w in windows] == [wire_date(START + DAY)]
        packed, fips, gb = windows[0]["reservations"]
        assert (packed["amount"], packed["available"]) == (3, 4)
        assert sorted(p["count"] for p in packed["placement"]) == [1, 2]
        assert all("host_name" not in p for p in packed["placement"])  # a member
        assert sorted(i["floating_ip_address"] for i in fips["items"]) == [
            "172.24.4.10",
            "172.24.4.11",
        ]
        assert (gb["pool"], gb["gb"], gb["available"]) == ("ssd", 50, 100)

        lease = {
            "name": "alice",
            "start_date": fmt(START + DAY),
            "end_date": fmt(START + DAY + 2 * HOURS),
            "reservations": ask["reservations"],
            "events": [],
        }
        created = http.post("/v1/leases", json=lease, headers=ALICE_HEADERS)
        assert created.status_code == 201, created.text
        got = created.json()["lease"]["reservations"]
        held = {r["resource_type"]: r["allocations"] for r in got}
        offered = {p["host"]: p["count"] for p in packed["placement"]}
        assert {a["resource_id"]: a["count"] for a in held["virtual:instance"]} == offered
        assert sorted(a["resource_id"] for a in held["virtual:floatingip"]) == sorted(
            i["id"] for i in fips["items"]
        )


def test_whole_hosts_and_instances_in_one_search_take_distinct_hosts(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        inventory(http)
        ask = {
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}, instances(2)],
            "duration": 3600,
            "search_start": fmt(START),
            "search_end": fmt(START + DAY),
            "limit": 1,
        }
        answer = http.post("/v1/availability", json=ask).json()
        assert_documented(live, "/v1/availability", "post", answer)
        [window] = answer["windows"]
        whole, packed = window["reservations"]
        assert [p["host"] for p in packed["placement"]] != whole["hosts"]
        assert packed["placement"][0]["count"] == 2 and "host_name" in packed["placement"][0]
        # Three instances do not fit beside a whole host at all.
        ask["reservations"][1] = instances(3)
        assert http.post("/v1/availability", json=ask).json()["windows"] == []


def timeline_of(live: LiveServer, http: httpx.Client, **params: str) -> dict[str, Any]:
    query = {"start": fmt(START), "end": fmt(START + 2 * DAY), "bucket": str(86400), **params}
    response = http.get("/v1/availability/timeline", params=query, headers=ALICE_HEADERS)
    assert response.status_code == 200, response.text
    assert_documented(live, "/v1/availability/timeline", "get", response.json())
    found: dict[str, Any] = response.json()["timeline"]
    return found


def test_timeline_per_resource_type(live_sqlite: LiveServer) -> None:
    with httpx.Client(base_url=live_sqlite.url, timeout=30) as http:
        inventory(http)
        bob = bob_lease(http)

        fips = timeline_of(
            live_sqlite, http, resource_type="virtual:floatingip", network_id="ext-net"
        )
        assert (fips["unit"], fips["total"]) == ("floating IPs", 2)
        assert [(b["free"], b["busy"], b["partly_busy"]) for b in fips["buckets"]] == [
            (1, 1, 0),
            (2, 0, 0),
        ]
        assert (
            timeline_of(live_sqlite, http, resource_type="virtual:floatingip", pool="other")[
                "total"
            ]
            == 0
        )
        devices = timeline_of(live_sqlite, http, resource_type="device")
        assert [b["free"] for b in devices["buckets"]] == [1, 1]

        gb = timeline_of(live_sqlite, http, resource_type="virtual:volume", pool="ssd")
        assert (gb["unit"], gb["total"]) == ("GB", 100)
        assert [(b["free"], b["largest"]) for b in gb["buckets"]] == [(20, 20), (100, 100)]

        sized = {k: str(v) for k, v in SIZE.items()}
        room = timeline_of(live_sqlite, http, resource_type="virtual:instance", **sized)
        assert (room["unit"], room["total"]) == ("instances", 4)
        assert [(b["free"], b["largest"]) for b in room["buckets"]] == [(0, 0), (4, 2)]
        small = timeline_of(
            live_sqlite, http, resource_type="virtual:instance", vcpus="2", memory_mb="1024"
        )
        assert [b["free"] for b in small["buckets"]] == [0, 8]

        hosts = timeline_of(
            live_sqlite, http
        )  # physical:host by default: instances make hosts busy
        assert hosts["hosts"] == 2 and [b["busy"] for b in hosts["buckets"]] == [2, 0]
        for answer in (fips, gb, room, hosts):
            assert bob["id"] not in json.dumps(answer)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"resource_type": "physical:gpu"}, "resource_type"),
        ({"resource_type": "virtual:instance", "memory_mb": "1024"}, "vcpus"),
        ({"resource_type": "virtual:instance", "vcpus": "2"}, "memory_mb"),
        ({"resource_type": "virtual:instance", "vcpus": "0", "memory_mb": "1"}, "vcpus"),
        ({"resource_type": "virtual:instance", "vcpus": "two", "memory_mb": "1"}, "vcpus"),
        (
            {"resource_type": "virtual:volume", "hypervisor_properties": '["==", "$a", "b"]'},
            "hypervisor_properties",
        ),
        ({"pool": "ssd"}, "pool"),
        ({"resource_type": "device", "vcpus": "2"}, "vcpus"),
        ({"resource_type": "virtual:floatingip", "pool": "a", "network_id": "b"}, "network_id"),
    ],
)
def test_a_bad_timeline_of_another_type_is_a_400_naming_the_field(
    live_sqlite: LiveServer, params: dict[str, str], field: str
) -> None:
    query = {"end": fmt(START + DAY), **params}
    response = httpx.get(
        f"{live_sqlite.url}/v1/availability/timeline", params=query, headers=ALICE_HEADERS
    )
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text


@pytest.mark.parametrize(
    ("reservation", "field"),
    [
        (instances(1, vcpus=64), "reservations[0].vcpus"),
        (instances(3, affinity=True), "reservations[0].amount"),
        (instances(1, vcpus=0), "reservations[0].vcpus"),
        (volume(10, pool="nowhere"), "reservations[0].pool"),
        (volume(60, amount=2), "reservations[0].size_gb"),
        ({**addresses(1), "network_id": "no-net"}, "reservations[0].network_id"),
    ],
)
def test_a_bad_mixed_search_is_a_400_naming_the_field(
    live_sqlite: LiveServer, reservation: dict[str, Any], field: str
) -> None:
    with httpx.Client(base_url=live_sqlite.url, timeout=30) as http:
        inventory(http)
        body = {
            "reservations": [reservation],
            "duration": 3600,
            "search_start": fmt(START),
            "search_end": fmt(START + DAY),
        }
        response = http.post("/v1/availability", json=body, headers=ALICE_HEADERS)
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text


# -- counter-offers for instances ----------------------------------------------------------------


def instance_lease(name: str, amount: int, start: dt.datetime, end: dt.datetime) -> LeaseRequest:
    fields = {"amount": amount, **SIZE}
    return LeaseRequest(
        name=name,
        start=start,
        end=end,
        reservations=[ReservationRequest("virtual:instance", fields)],
    )


def test_a_refused_instance_lease_is_offered_later_fewer_and_shorter(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    for i in range(2):
        hosts.create(ADMIN, f"c{i}", {"vcpus": 8, "memory_mb": 8192, "local_gb": 100})
    bob = leases.create(BOB, instance_lease("bob-secret", 3, T0 + 1 * HOURS, T0 + 3 * HOURS))

    with pytest.raises(NotEnoughCapacity) as caught:
        leases.create(ALICE, instance_lease("alice", 2, T0 + HOURS / 2, T0 + 2 * HOURS))

    details = json.loads(json.dumps(refusal_body(caught.value)))
    for secret in (bob.id, bob.name, bob.project_id, bob.reservations[0].id):
        assert secret not in json.dumps(details)
    [reason] = details["reason"]["reservations"]
    assert (reason["rule"], reason["matching"], reason["free"]) == ("too_few_free", 4, 1)
    offers = {o["kind"]: o for o in details["offers"]}
    assert list(offers) == ["later_start", "fewer_hosts", "shorter"]
    later = offers["later_start"]["lease"]
    assert (later["start_date"], later["end_date"]) == (
        "2030-01-01T15:00:00.000000",
        "2030-01-01T16:30:00.000000",
    )
    fewer = offers["fewer_hosts"]
    assert fewer["below_request"] is True
    assert [r["amount"] for r in fewer["lease"]["reservations"]] == [1]
    assert "min" not in fewer["lease"]["reservations"][0]
    assert offers["shorter"]["lease"]["end_date"] == "2030-01-01T13:00:00.000000"
    for offer in details["offers"]:
        dry = leases.create(
            ALICE, LeaseCreate.model_validate({**offer["lease"], "dry_run": True}).request()
        )
        assert sum(a.count for a in dry.reservations[0].instance_allocations) >= 1
    accepted = leases.create(
        ALICE, LeaseCreate.model_validate(offers["later_start"]["lease"]).request()
    )
    assert sum(a.count for a in accepted.reservations[0].instance_allocations) == 2


def test_a_refused_lease_of_addresses_and_a_volume_is_offered_a_later_start_only(
    ctx: ServiceContext, leases: LeaseService
) -> None:
    ItemService(ctx, FLOATING_IPS).create(
        ADMIN, {"floating_network_id": "ext-net", "floating_ip_address": "172.24.4.10"}
    )
    VolumePoolService(ctx).create(ADMIN, {"name": "ssd", "capacity_gb": 100})
    mixed = [
        ReservationRequest("virtual:floatingip", {"network_id": "ext-net", "amount": 1}),
        ReservationRequest("virtual:volume", {"size_gb": 60}),
    ]
    leases.create(
        BOB, LeaseRequest(name="bob", start=T0 + HOURS, end=T0 + 3 * HOURS, reservations=mixed)
    )

    with pytest.raises(NotEnoughCapacity) as caught:
        leases.create(
            ALICE,
            LeaseRequest(
                name="alice", start=T0 + 2 * HOURS, end=T0 + 4 * HOURS, reservations=mixed
            ),
        )

    details = json.loads(json.dumps(refusal_body(caught.value)))
    rules = [(r["resource_type"], r["rule"]) for r in details["reason"]["reservations"]]
    assert rules == [("virtual:floatingip", "too_few_free"), ("virtual:volume", "too_few_free")]
    [offer] = details["offers"]  # no fewer: an amount of addresses or GB is not cut
    assert offer["kind"] == "later_start"
    assert offer["lease"]["start_date"] == "2030-01-01T15:00:00.000000"
    assert [r.get("amount") for r in offer["lease"]["reservations"]] == [1, 1]
    assert leases.create(ALICE, LeaseCreate.model_validate(offer["lease"]).request()).reservations
