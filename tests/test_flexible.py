"""Flexible windows: ``earliest_start``, ``latest_end`` and ``duration`` instead of fixed dates.

The service picks the earliest start that fits, checked against brute force on random calendars
built through the service; a window taken between the search and the admission is searched
again; over HTTP, the answer shows the chosen dates and the request, and bad input is a 400
naming the field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from climate.api.parsing import parse_duration
from climate.cli.main import main
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0, LiveServer
from tests.helpers import add_hosts, host_request, hosts_of

MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)


def flexible(
    name: str,
    earliest: dt.datetime | None,
    latest: dt.datetime,
    duration: dt.timedelta,
    count: int = 1,
) -> LeaseRequest:
    return dataclasses.replace(host_request(name, earliest, latest, count), duration=duration)


bookings = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 16)),
    max_size=6,
)
"""(host, start, length) in quarters of an hour from T0."""


@given(
    booked=bookings,
    count=st.integers(1, 3),
    earliest=st.integers(0, 24),
    length=st.integers(1, 16),
    room=st.integers(0, 40),
)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_flexible_lease_gets_the_earliest_start_that_fits(
    ctx: ServiceContext,
    hosts: HostService,
    leases: LeaseService,
    booked: list[tuple[int, int, int]],
    count: int,
    earliest: int,
    length: int,
    room: int,
) -> None:
    quarter = 15 * MINUTE
    # The fixtures live for every example: the hosts are made once, the leases undone each time.
    added = [h.id for h in hosts.list_all(ADMIN)] or add_hosts(hosts, 3)
    spans: list[tuple[int, dt.datetime, dt.datetime]] = []
    made = []
    try:
        for i, (host, start, span) in enumerate(booked):
            begin, end = T0 + start * quarter, T0 + (start + span) * quarter
            free = [h for h in added if all(e <= begin or s >= end for g, s, e in spans if g == h)]
            if host >= len(free):
                continue
            lease = leases.create(BOB, host_request(f"b{i}", begin, end, 1))
            made.append(lease)
            spans += [(h, begin, end) for h in hosts_of(lease)]
        # Late binding may have moved earlier bookings to make room for later ones.
        spans = [
            (h, lease.start_date, lease.end_date)
            for lease in (leases.get(BOB, m.id) for m in made)
            for h in hosts_of(lease)
        ]
        first, duration = T0 + earliest * quarter, length * quarter
        latest = first + duration + room * quarter

        def fits(t: dt.datetime) -> bool:
            busy = {h for h, s, e in spans if s < t + duration and e > t}
            return len(set(added) - busy) >= count

        # Every busy span starts and ends on the minute: the earliest fit is on the minute too.
        minutes = int((latest - duration - first) / MINUTE)
        expected = next(
            (first + k * MINUTE for k in range(minutes + 1) if fits(first + k * MINUTE)), None
        )
        request = dataclasses.replace(
            flexible("alice", first, latest, duration, count), dry_run=True
        )
        if expected is None:
            with pytest.raises(NotEnoughCapacity):
                leases.create(ALICE, request)
        else:
            lease = leases.create(ALICE, request)
            assert (lease.start_date, lease.end_date) == (expected, expected + duration)
            assert len(hosts_of(lease)) == count
    finally:
        for lease in made:
            leases.delete(BOB, lease.id)


def test_a_window_taken_meanwhile_is_searched_again(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(hosts, 1)
    leases.create(BOB, host_request("bob", T0 + HOUR, T0 + 2 * HOUR))
    create = leases.create
    raced: list[dt.datetime | None] = []

    def bob_first(actor: Any, request: LeaseRequest) -> Any:
        """Bob takes the chosen window between Alice's search and her admission, once."""
        if request.duration is None and not raced:
            raced.append(request.start)
            create(BOB, host_request("bob-2", request.start, request.end))
        return create(actor, request)

    monkeypatch.setattr(leases, "create", bob_first)

    lease = leases.create(ALICE, flexible("alice", T0, T0 + 10 * HOUR, 2 * HOUR))

    # Two hours do not fit before Bob's 13:00 lease: the search chose 14:00; Bob took 14:00 to
    # 16:00 meanwhile; the second search found 16:00.
    assert raced == [T0 + 2 * HOUR]
    assert (lease.start_date, lease.end_date) == (T0 + 4 * HOUR, T0 + 6 * HOUR)


def test_flexible_input_is_checked(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    cases = {
        "duration": flexible("a", T0, T0 + HOUR, dt.timedelta(0)),
        "latest_end": flexible("a", T0 + HOUR, T0 + 90 * MINUTE, HOUR),
        "before_end_date": dataclasses.replace(
            flexible("a", T0, T0 + 3 * HOUR, HOUR), before_end=T0 + HOUR
        ),
    }
    for field, request in cases.items():
        with pytest.raises(InvalidInput) as caught:
            leases.create(ALICE, request)
        assert caught.value.field == field


def test_durations_in_seconds_clock_time_or_iso_8601() -> None:
    assert parse_duration("duration", 5400) == 90 * MINUTE
    assert parse_duration("duration", "5400") == 90 * MINUTE
    assert parse_duration("duration", "01:30") == 90 * MINUTE
    assert parse_duration("duration", "PT1H30M") == 90 * MINUTE
    assert parse_duration("duration", "P1DT2S") == dt.timedelta(days=1, seconds=2)
    for bad in ("P", "PT", "P1DT", "1h", "", None, True, "P1Y"):
        with pytest.raises(InvalidInput, match="^duration: "):
            parse_duration("duration", bad)


# -- over HTTP -----------------------------------------------------------------------------------

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
OTHER = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
START = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(days=2)


def fmt(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M")


def wire_date(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")


def ask(name: str, **window: Any) -> dict[str, Any]:
    return {
        "name": name,
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
        **window,
    }


def test_a_flexible_lease_over_http(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert http.post("/v1/os-hosts", json={"name": "c1"}).status_code == 201
        fixed = ask("bob-secret", start_date=fmt(START), end_date=fmt(START + 3 * HOUR))
        assert http.post("/v1/leases", json=fixed, headers=OTHER).status_code == 201
        window = {
            "earliest_start": fmt(START + HOUR),
            "latest_end": fmt(START + 8 * HOUR),
            "duration": "02:00",
        }

        created = http.post("/v1/leases", json=ask("alice", **window), headers=MEMBER)

        assert created.status_code == 201, created.text
        answer = created.json()
        assert answer["lease"]["start_date"] == wire_date(START + 3 * HOUR)
        assert answer["lease"]["end_date"] == wire_date(START + 5 * HOUR)
        assert answer["requested_window"] == {
            "earliest_start": wire_date(START + HOUR),
            "latest_end": wire_date(START + 8 * HOUR),
            "duration": 7200,
        }
        shown = http.get(f"/v1/leases/{answer['lease']['id']}", headers=MEMBER).json()["lease"]
        assert shown["start_date"] == wire_date(START + 3 * HOUR)
        assert shown["requested_window"] == answer["requested_window"]
        assert http.get("/v1/leases", headers=OTHER).json()["leases"][0]["requested_window"] is None

        # Nothing is free long enough before latest_end: a 409 with offers beyond it.
        late = {**window, "latest_end": fmt(START + 6 * HOUR), "duration": "PT3H"}
        refused = http.post("/v1/leases", json=ask("alice-2", **late), headers=MEMBER)
        assert refused.status_code == 409, refused.text
        assert "bob-secret" not in refused.text and "project-b" not in refused.text
        offers = {o["kind"]: o["lease"] for o in refused.json()["offers"]}
        assert offers["later_start"]["start_date"] == wire_date(START + 5 * HOUR)
        accepted = http.post("/v1/leases", json=offers["later_start"], headers=MEMBER)
        assert accepted.status_code == 201, accepted.text


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"duration": 0}, "duration"),
        ({"duration": "-60"}, "duration"),
        ({"duration": "two hours"}, "duration"),
        ({"latest_end": fmt(START + 30 * dt.timedelta(minutes=1))}, "latest_end"),
        ({"start_date": fmt(START)}, "earliest_start"),
        ({"end_date": fmt(START + 9 * HOUR)}, "latest_end"),
        ({"latest_end": None}, "latest_end"),
        ({"duration": None}, "duration"),
        ({"earliest_start": "soon"}, "earliest_start"),
    ],
)
def test_bad_flexible_windows_are_400s_naming_the_field(
    live_sqlite: LiveServer, window: dict[str, Any], field: str
) -> None:
    good = {"earliest_start": fmt(START), "latest_end": fmt(START + 4 * HOUR), "duration": 3600}
    sent = {k: v for k, v in {**good, **window}.items() if v is not None}
    with httpx.Client(base_url=live_sqlite.url, timeout=30) as http:
        response = http.post("/v1/leases", json=ask("alice", **sent))
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: ")


def test_the_cli_creates_flexible_leases_dry_runs_and_prints_offers(
    live_sqlite: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", live_sqlite.url]
    main(["host", "create", "c1", *url])
    window = ["--earliest-start", fmt(START), "--latest-end", fmt(START + 9 * HOUR)]
    main(["lease", "create", "first", "--duration", "PT2H", *window, "--dry-run", *url])
    assert "dry run: nothing was created" in capsys.readouterr().out
    main(["lease", "create", "first", "--duration", "PT2H", *window, "--json", *url])
    assert json.loads(capsys.readouterr().out)["start_date"] == wire_date(START)

    fixed = ["--start", fmt(START + HOUR), "--end", fmt(START + 3 * HOUR)]
    with pytest.raises(SystemExit) as refused:
        main(["lease", "create", "second", *fixed, *url])

    message = str(refused.value)
    assert message.startswith("error (409): Not enough hosts available")
    assert f"later_start: --start '{fmt(START + 2 * HOUR)}'" in message
