"""Availability search and capacity timeline.

The planner (``climate.planner.availability``) is checked against brute force on small random
calendars: every grid point of the range is tried, host by host, span by span. Then the service
and the API over a live server: the answer's shape, what admission then does with a window,
4xx naming the field, and that a member's answer names no other project's lease.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from climate.cli.main import main
from climate.cli.output import show_date
from climate.config import Settings
from climate.db.engine import Database
from climate.planner.availability import (
    HostPlacer,
    HostRequest,
    SearchRange,
    Window,
    earliest,
    timeline,
)
from climate.planner.calendar import Calendar, HostSet, Span
from climate.runtime import build_context
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ALICE as ALICE_ACTOR
from tests.conftest import LiveServer

MINUTE = 60
HOUR = 3600
T0 = 528_000 * HOUR
"""2030-03-27 00:00 UTC, in seconds since the epoch."""
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)


@dataclass(frozen=True)
class World:
    gpu: tuple[bool, ...]
    """Per host (ids 1..n): whether it has the property searched for."""
    spans: tuple[tuple[int, float, float], ...]
    """(host, start, end), never overlapping on one host."""

    def calendar(self) -> Calendar:
        return Calendar.of(Span(h, s, e, f"r{i}") for i, (h, s, e) in enumerate(self.spans))

    def hosts(self, query: str) -> HostSet:
        return HostSet(
            (h, f"host-{h}") for h in range(1, len(self.gpu) + 1) if self.matches(h, query)
        )

    def matches(self, host: int, query: str) -> bool:
        return query == "all" or self.gpu[host - 1] == (query == "gpu")

    def free(self, host: int, start: float, end: float) -> bool:
        return all(e <= start or s >= end for h, s, e in self.spans if h == host)

    def free_hosts(self, query: str, start: float, end: float) -> set[int]:
        return {
            h
            for h in range(1, len(self.gpu) + 1)
            if self.matches(h, query) and self.free(h, start, end)
        }


@st.composite
def worlds(draw: st.DrawFn) -> World:
    count = draw(st.integers(1, 6))
    gpu = tuple(draw(st.lists(st.booleans(), min_size=count, max_size=count)))
    spans = []
    for host in range(1, count + 1):
        # Minutes with a few odd seconds, starting before the range: spans that meet end to end,
        # and ends that fall between grid points.
        cursor = T0 - draw(st.integers(0, 6)) * HOUR + draw(st.sampled_from([0, 0, 0, 17.5]))
        for _ in range(draw(st.integers(0, 6))):
            cursor += draw(st.sampled_from([0, 0, 1, 5, 30, 90, 240, 600])) * MINUTE
            length = draw(st.sampled_from([1, 10, 45, 60, 180, 720])) * MINUTE
            spans.append((host, cursor, cursor + length))
            cursor += length
    return World(gpu, tuple(spans))


def grid_points(search: SearchRange) -> list[int]:
    return list(range(search.first, search.last + 1, search.step))


def openings(world: World, kinds: set[str], search: SearchRange) -> list[int]:
    """The starts worth offering: the range's first, and each grid point at which a matching
    host becomes free (a busy span ends, rounded up to the grid)."""
    ends = {
        -(-e // search.step) * search.step
        for h, _, e in world.spans
        if any(world.matches(h, kind) for kind in kinds)
    }
    starts = {search.first, *ends}
    return sorted(int(t) for t in starts if search.first <= t <= search.last)


def assert_nothing_missed(starts: list[int], fitting: list[int], search: SearchRange) -> None:
    """The first fitting start is offered, and every fitting start up to the last offered one
    is reached from an offered one by fitting starts only (it is that window, shifted later)."""
    assert not fitting or starts[:1] == fitting[:1]
    fits = set(fitting)
    for t in fitting:
        if starts and t <= starts[-1]:
            back = t
            while back not in starts:
                back -= search.step
                assert back in fits, (t, starts)


searches = st.builds(
    lambda offset, length, duration, step: SearchRange(
        T0 + offset, T0 + offset + length, duration, step
    ),
    offset=st.integers(-2 * HOUR, 12 * HOUR),
    length=st.integers(0, 30 * HOUR),
    duration=st.sampled_from([1, 15 * MINUTE, HOUR, 4 * HOUR, 20 * HOUR]),
    step=st.sampled_from([1 * MINUTE, 15 * MINUTE, HOUR]),
)
queries = st.sampled_from(["all", "gpu", "plain"])


def search(world: World, requests: list[tuple[str, int, int]], within: SearchRange, limit: int):
    calendar = world.calendar()
    placer = HostPlacer(
        calendar,
        [HostRequest(i, world.hosts(q), low, high) for i, (q, low, high) in enumerate(requests)],
        within,
    )
    return earliest([placer], within, limit)


def check_window(
    world: World, requests: list[tuple[str, int, int]], window: Window, within: SearchRange
) -> None:
    """The window lies in the range, on the grid, and each reservation gets hosts that match,
    are free for all of it, are nobody else's in the request, and number as admission grants."""
    assert within.start <= window.start and window.end <= within.end
    assert window.start % within.step == 0 and window.end - window.start == within.duration
    taken: set[int] = set()
    for k, (query, low, high) in enumerate(requests):
        placement = window.placements[k]
        assert placement.index == k
        chosen = set(placement.resources)
        left = world.free_hosts(query, window.start, window.end) - taken
        assert chosen <= left and len(chosen) == len(placement.resources)
        assert placement.available == len(left)
        assert len(chosen) == min(high, len(left)) and len(chosen) >= low
        taken |= chosen


@given(
    world=worlds(),
    query=queries,
    low=st.integers(1, 4),
    extra=st.integers(0, 2),
    within=searches,
    limit=st.integers(1, 5),
)
@PROPERTY_SETTINGS
def test_one_reservation_gets_exactly_the_earliest_fitting_starts(
    world: World, query: str, low: int, extra: int, within: SearchRange, limit: int
) -> None:
    requests = [(query, low, low + extra)]
    found = search(world, requests, within, limit)

    def fits(t: int) -> bool:
        return len(world.free_hosts(query, t, t + within.duration)) >= low

    starts = [w.start for w in found]
    assert starts == [t for t in openings(world, {query}, within) if fits(t)][:limit]
    assert_nothing_missed(starts, [t for t in grid_points(within) if fits(t)], within)
    for window in found:
        check_window(world, requests, window, within)


@given(
    world=worlds(),
    requests=st.lists(
        st.tuples(queries, st.integers(1, 3), st.integers(0, 2)).map(
            lambda r: (r[0], r[1], r[1] + r[2])
        ),
        min_size=2,
        max_size=3,
    ),
    within=searches,
    limit=st.integers(1, 4),
)
@PROPERTY_SETTINGS
def test_several_reservations_fit_at_once_on_distinct_hosts(
    world: World, requests: list[tuple[str, int, int]], within: SearchRange, limit: int
) -> None:
    found = search(world, requests, within, limit)
    starts = [w.start for w in found]
    assert starts == sorted(set(starts))
    for window in found:
        check_window(world, requests, window, within)
    kinds = {q for q, _, _ in requests}
    if kinds in ({"all"}, {"gpu"}, {"plain"}, {"gpu", "plain"}):
        # Equal or disjoint host sets: which hosts one takes cannot matter to another, so a
        # start fits exactly when, set by set, each takes as many as it may of what is left and
        # that is at least its min.
        def fits(t: int) -> bool:
            left = {k: len(world.free_hosts(k, t, t + within.duration)) for k in kinds}
            for kind, low, high in requests:
                if left[kind] < low:
                    return False
                left[kind] -= min(high, left[kind])
            return True

        assert starts == [t for t in openings(world, kinds, within) if fits(t)][:limit]
        assert_nothing_missed(starts, [t for t in grid_points(within) if fits(t)], within)


def test_a_window_opens_when_a_span_ends_not_on_a_sample() -> None:
    # One host, busy until 10:07:30; an hour is wanted, on a one-minute grid.
    world = World((True,), ((1, T0, T0 + 10 * HOUR + 7 * MINUTE + 30),))
    within = SearchRange(T0, T0 + 24 * HOUR, HOUR, MINUTE)
    [window] = search(world, [("all", 1, 1)], within, 1)
    assert window.start == T0 + 10 * HOUR + 8 * MINUTE
    assert window.placements[0].resources == (1,)


def test_two_hosts_never_free_together_for_two_hours() -> None:
    # Host 1 busy 1h-2h, host 2 busy 3h-4h, in a 5-hour range: each alone has room.
    world = World((True, True), ((1, T0 + HOUR, T0 + 2 * HOUR), (2, T0 + 3 * HOUR, T0 + 4 * HOUR)))
    within = SearchRange(T0, T0 + 5 * HOUR, 2 * HOUR, MINUTE)
    assert search(world, [("all", 2, 2)], within, 3) == []
    found = search(world, [("all", 1, 2)], within, 3)
    assert [(w.start - T0, w.placements[0].resources) for w in found] == [
        (0, (2,)),
        (2 * HOUR, (1,)),
    ]


@given(
    world=worlds(),
    query=queries,
    offset=st.integers(-3 * HOUR, 3 * HOUR),
    bucket=st.sampled_from([MINUTE, 15 * MINUTE, HOUR, 3 * HOUR]),
    count=st.integers(1, 30),
)
@PROPERTY_SETTINGS
def test_timeline_counts_free_busy_and_partly_busy_hosts_per_bucket(
    world: World, query: str, offset: int, bucket: int, count: int
) -> None:
    hosts = world.hosts(query)
    found = timeline(world.calendar(), hosts, T0 + offset, bucket, count)
    for i in range(count):
        start = T0 + offset + i * bucket
        end = start + bucket
        covered = {
            h: sum(max(0.0, min(e, end) - max(s, start)) for g, s, e in world.spans if g == h)
            for h in hosts.ids.tolist()
        }
        expected = (
            sum(c == 0 for c in covered.values()),
            sum(c == bucket for c in covered.values()),
            sum(0 < c < bucket for c in covered.values()),
        )
        assert (found.free[i], found.busy[i], found.partly[i]) == expected, i
    assert found.hosts == len(hosts.ids)


# -- over HTTP -----------------------------------------------------------------------------------

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
DAY = dt.timedelta(days=1)
HOUR_DELTA = dt.timedelta(hours=1)
START = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + 2 * DAY


def fmt(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M")


def wire_date(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")


GPU = '["==", "$gpu", "a100"]'


def gpu_hosts(low: int, high: int | None = None) -> dict[str, Any]:
    return {
        "resource_type": "physical:host",
        "min": low,
        "max": high or low,
        "resource_properties": GPU,
    }


def lease(name: str, start: dt.datetime, end: dt.datetime, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": fmt(start),
        "end_date": fmt(end),
        "reservations": [gpu_hosts(count)],
        "events": [],
    }


@contextlib.contextmanager
def with_hosts(live: LiveServer) -> Iterator[httpx.Client]:
    """Admin client on a server with gpu hosts g1, g2 and a plain host p1."""
    with httpx.Client(base_url=live.url, timeout=30) as http:
        for name, extra in (("g1", {"gpu": "a100"}), ("g2", {"gpu": "a100"}), ("p1", {})):
            assert http.post("/v1/os-hosts", json={"name": name, **extra}).status_code == 201
        yield http


def test_a_member_gets_the_earliest_window_and_admission_grants_what_was_offered(
    live: LiveServer,
) -> None:
    with with_hosts(live) as http:
        bob = http.post(
            "/v1/leases", json=lease("bob-secret", START, START + DAY, 2), headers=BOB
        ).json()["lease"]
        ask = {
            "reservations": [gpu_hosts(1, 2)],
            "duration": "24:00",
            "search_start": fmt(START),
            "search_end": fmt(START + 5 * DAY),
            "limit": 2,
        }
        response = http.post("/v1/availability", json=ask, headers=ALICE)
        assert response.status_code == 200, response.text
        for secret in (bob["id"], bob["name"], bob["reservations"][0]["id"], "project-b"):
            assert secret not in response.text
        windows = response.json()["windows"]
        # Both gpu hosts are Bob's for the first day: the first window opens when his lease ends.
        assert [w["start_date"] for w in windows] == [wire_date(START + DAY)]
        [offered] = windows[0]["reservations"]
        assert offered["available"] == 2 and len(offered["hosts"]) == 2
        assert "host_names" not in offered  # a member may not list hosts

        admin_view = http.post("/v1/availability", json=ask).json()["windows"][0]
        assert sorted(admin_view["reservations"][0]["host_names"]) == ["g1", "g2"]

        taken = http.post(
            "/v1/leases", json=lease("alice", START + DAY, START + 2 * DAY, 2), headers=ALICE
        )
        assert taken.status_code == 201, taken.text
        granted = [
            a["resource_id"] for a in taken.json()["lease"]["reservations"][0]["allocations"]
        ]
        assert sorted(granted) == sorted(offered["hosts"])


def test_the_search_sees_leases_admitted_by_another_process(
    live: LiveServer, settings: Settings, database_url: str
) -> None:
    with with_hosts(live) as http:
        ask = {
            "reservations": [gpu_hosts(2)],
            "duration": 3600,
            "search_start": fmt(START),
            "search_end": fmt(START + 3 * DAY),
            "limit": 1,
        }
        first = http.post("/v1/availability", json=ask).json()["windows"]
        assert [w["start_date"] for w in first] == [wire_date(START)]
        other = Database(database_url)
        try:
            LeaseService(build_context(settings, other)).create(
                ALICE_ACTOR,
                LeaseRequest(
                    name="elsewhere",
                    start=START,
                    end=START + DAY,
                    reservations=[
                        ReservationRequest(
                            "physical:host", {"min": 1, "max": 1, "resource_properties": GPU}
                        )
                    ],
                ),
            )
        finally:
            other.dispose()
        after = http.post("/v1/availability", json=ask).json()["windows"]
        assert [w["start_date"] for w in after] == [wire_date(START + DAY)]


def test_timeline_counts_hosts_per_bucket_and_names_nobody(live: LiveServer) -> None:
    with with_hosts(live) as http:
        bob = http.post(
            "/v1/leases",
            json=lease("bob-secret", START + DAY, START + DAY + 12 * HOUR_DELTA, 1),
            headers=BOB,
        ).json()["lease"]
        response = http.get(
            "/v1/availability/timeline",
            params={
                "start": fmt(START),
                "end": fmt(START + 3 * DAY),
                "bucket": str(12 * 3600),
                "resource_properties": GPU,
            },
            headers=ALICE,
        )
        assert response.status_code == 200, response.text
        assert bob["id"] not in response.text and "bob-secret" not in response.text
        found = response.json()["timeline"]
        assert (found["hosts"], found["bucket"]) == (2, 12 * 3600)
        counts = [(b["free"], b["busy"], b["partly_busy"]) for b in found["buckets"]]
        assert counts == [(2, 0, 0), (2, 0, 0), (1, 1, 0), (2, 0, 0), (2, 0, 0), (2, 0, 0)]
        assert found["buckets"][2]["start_date"] == wire_date(START + DAY)


def search_body(**changes: Any) -> dict[str, Any]:
    body = {
        "reservations": [gpu_hosts(1)],
        "duration": 3600,
        "search_start": fmt(START),
        "search_end": fmt(START + DAY),
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (search_body(search_end="next week"), "search_end"),
        (search_body(search_start="2031-02-30 10:00"), "search_start"),
        (search_body(search_end=None), "search_end"),
        (search_body(duration=0), "duration"),
        (search_body(duration=-60), "duration"),
        (search_body(duration="1h"), "duration"),
        (search_body(duration=2 * 86400), "duration"),
        (search_body(search_end=fmt(START - DAY)), "search_end"),
        (search_body(search_end=fmt(START + 401 * DAY)), "search_end"),
        (search_body(limit=0), "limit"),
        (search_body(limit=21), "limit"),
        (search_body(step=0), "step"),
        (search_body(reservations=[]), "reservations"),
        (search_body(reservations=[{"min": 1, "max": 1}]), "reservations[0].resource_type"),
        (search_body(reservations=[{**gpu_hosts(2), "max": 1}]), "reservations[0].max"),
        (
            search_body(reservations=[{**gpu_hosts(1), "resource_properties": '["~", "$a", 1]'}]),
            "reservations[0].resource_properties",
        ),
        (search_body(colour="red"), "colour"),
    ],
)
def test_a_bad_search_is_a_400_naming_the_field(
    live_sqlite: LiveServer, body: dict[str, Any], field: str
) -> None:
    response = httpx.post(f"{live_sqlite.url}/v1/availability", json=body, headers=ALICE)
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": fmt(START)}, "end"),
        ({"end": "soon"}, "end"),
        ({"end": fmt(START), "start": fmt(START + DAY)}, "end"),
        ({"end": fmt(START), "bucket": "0"}, "bucket"),
        ({"end": fmt(START), "bucket": "an hour"}, "bucket"),
        ({"end": fmt(START + 300 * DAY), "bucket": "60"}, "bucket"),
        ({"end": fmt(START), "start": fmt(START - 60 * DAY)}, "start"),
        ({"end": fmt(START), "resource_properties": "[1]"}, "resource_properties"),
    ],
)
def test_a_bad_timeline_is_a_400_naming_the_field(
    live_sqlite: LiveServer, params: dict[str, str], field: str
) -> None:
    response = httpx.get(
        f"{live_sqlite.url}/v1/availability/timeline", params=params, headers=ALICE
    )
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text


def test_cli_searches_and_charts(
    live_sqlite: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ("--url", live_sqlite.url)
    with with_hosts(live_sqlite) as http:
        bob = lease("bob", START, START + DAY, 2)
        assert http.post("/v1/leases", json=bob, headers=BOB).status_code == 201
    main(
        [
            "availability",
            "search",
            "--duration",
            "2:00",
            "--start",
            fmt(START),
            "--end",
            fmt(START + 3 * DAY),
            "--min",
            "2",
            "--properties",
            GPU,
            "--json",
            *url,
        ]
    )
    windows = json.loads(capsys.readouterr().out)
    assert [w["start_date"] for w in windows] == [wire_date(START + DAY)]
    main(
        [
            "availability",
            "search",
            "--duration",
            "2:00",
            "--start",
            fmt(START),
            "--end",
            fmt(START + 3 * DAY),
            "--properties",
            GPU,
            *url,
        ]
    )
    # One host wanted, two free; equal fits go to the lower id.
    begin, end = (show_date(wire_date(START + DAY + h * HOUR_DELTA)) for h in (0, 2))
    window = f"| {begin} | {end} |"
    assert f"{window} 2    | g1    |" in capsys.readouterr().out
    main(
        [
            "availability",
            "timeline",
            "--start",
            fmt(START),
            "--end",
            fmt(START + 2 * DAY),
            "--bucket",
            str(86400),
            "--properties",
            GPU,
            *url,
        ]
    )
    out = capsys.readouterr().out
    assert "2 matching host(s), buckets of 86400 s" in out
    assert [line.split("|")[2:5] for line in out.splitlines() if line.startswith("| 20")] == [
        [" 0    ", " 0           ", " 2    "],
        [" 2    ", " 0           ", " 0    "],
    ]
