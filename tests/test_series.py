"""Recurring leases (series), end to end over HTTP with the manager running, on SQLite and
PostgreSQL; the occurrence list against dateutil's expansion (hypothesis); the command line."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from dateutil.rrule import rrulestr
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from climate.db.records import AuditLog
from climate.db.tables import Event, HostAllocation, Lease, LeaseSeries, OutboxMessage, Reservation
from climate.errors import NotEnoughCapacity
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService, ReservationRequest
from climate.services.series import Conflicts, SeriesRequest, SeriesService
from tests.conftest import ALICE as ALICE_ACTOR
from tests.conftest import T0, LiveServer
from tests.helpers import add_hosts, host_request, refusal_body
from tests.test_cli import run, run_json

ADMIN = {"X-Project-Id": "admin-project", "X-User-Id": "admin", "X-Roles": "admin"}
ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
WIRE = "%Y-%m-%dT%H:%M:%S.%f"
DAY = dt.timedelta(days=1)
HOUR = dt.timedelta(hours=1)
HOST = {
    "resource_type": "physical:host",
    "min": 1,
    "max": 1,
    "hypervisor_properties": "",
    "resource_properties": "",
}


@pytest.fixture
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60, headers=ALICE) as client:
        client.post("/v1/os-hosts", json={"name": "c1"}, headers=ADMIN).raise_for_status()
        yield client


def tomorrow() -> dt.datetime:
    """10:00 UTC the day after tomorrow: a start every test can recur from."""
    today = dt.datetime.now(dt.UTC).replace(hour=10, minute=0, second=0, microsecond=0)
    return today + 2 * DAY


def iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat()


def wire(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime(WIRE)


def series_body(name: str, start: dt.datetime, rrule: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": iso(start),
        "end_date": iso(start + HOUR),
        "rrule": rrule,
        "reservations": [HOST],
        **extra,
    }


def lease_body(name: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    return {"name": name, "start_date": iso(start), "end_date": iso(end), "reservations": [HOST]}


def created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def counts(ctx: ServiceContext) -> dict[str, int]:
    """Rows per table that creating a series or a lease writes to."""
    tables = (Lease, Reservation, Event, HostAllocation, LeaseSeries, AuditLog, OutboxMessage)
    with ctx.db.reader() as session:
        return {
            t.__tablename__: int(session.scalar(select(func.count()).select_from(t)) or 0)
            for t in tables
        }


def test_a_series_is_one_lease_per_occurrence_without_its_exdates(http: httpx.Client) -> None:
    start = tomorrow()
    answer = created(
        http.post(
            "/v1/lease-series",
            json=series_body(
                "standup",
                start,
                "FREQ=DAILY;COUNT=5",
                exdates=[iso(start + 2 * DAY)],
                reminders=["PT10M"],
            ),
        )
    )
    series, skipped = answer["series"], answer["skipped"]
    assert skipped == []
    assert series["rrule"] == "FREQ=DAILY;COUNT=5"
    assert series["exdates"] == [wire(start + 2 * DAY)]
    assert series["duration"] == 3600 and series["reminders"] == ["PT10M"]
    expected = [start + n * DAY for n in (0, 1, 3, 4)]
    assert [o["occurrence"] for o in series["occurrences"]] == [wire(t) for t in expected]
    assert [o["start_date"] for o in series["occurrences"]] == [wire(t) for t in expected]
    assert {o["status"] for o in series["occurrences"]} == {"PENDING"}
    for occurrence, at in zip(series["occurrences"], expected, strict=True):
        lease = http.get(f"/v1/leases/{occurrence['lease_id']}").json()["lease"]
        assert lease["series_id"] == series["id"]
        assert lease["occurrence"] == wire(at)
        assert lease["name"] == "standup-" + at.strftime("%Y%m%dT%H%M%SZ")
        assert lease["reminders"] == ["PT10M"]
    shown = http.get(f"/v1/lease-series/{series['id']}").json()["series"]
    assert shown["occurrences"] == series["occurrences"] and shown["cancelled"] == []
    [listed] = [s for s in http.get("/v1/lease-series").json()["series"] if s["name"] == "standup"]
    assert listed["id"] == series["id"] and "occurrences" not in listed


def test_a_series_that_does_not_all_fit_is_refused_whole_listing_each_conflict(
    live: LiveServer, http: httpx.Client
) -> None:
    start = tomorrow()
    for n in (1, 3):
        at = start + n * DAY
        created(http.post("/v1/leases", json=lease_body(f"blocker-{n}", at, at + HOUR)))
    before = counts(live.ctx)
    response = http.post(
        "/v1/lease-series", json=series_body("weekly", start, "FREQ=DAILY;COUNT=4")
    )
    assert response.status_code == 409, response.text
    error = response.json()
    assert error["error_name"] == 409 and "conflicts" in error
    assert error["error_message"].startswith("2 of 4 occurrences do not fit")
    conflicts = error["conflicts"]
    assert [c["occurrence"] for c in conflicts] == [wire(start + DAY), wire(start + 3 * DAY)]
    for conflict in conflicts:
        [reason] = conflict["reason"]["reservations"]
        assert (reason["rule"], reason["matching"], reason["free"]) == ("too_few_free", 1, 0)
        assert conflict["error_message"]
    assert counts(live.ctx) == before  # nothing at all was written
    assert "weekly" not in {s["name"] for s in http.get("/v1/lease-series").json()["series"]}


def test_a_series_may_skip_the_occurrences_that_do_not_fit(http: httpx.Client) -> None:
    start = tomorrow()
    at = start + DAY
    created(http.post("/v1/leases", json=lease_body("blocker", at, at + HOUR)))
    answer = created(
        http.post(
            "/v1/lease-series",
            json=series_body("best", start, "FREQ=DAILY;COUNT=3", conflicts="skip"),
        )
    )
    occurrences = answer["series"]["occurrences"]
    assert [o["occurrence"] for o in occurrences] == [wire(start), wire(start + 2 * DAY)]
    [skipped] = answer["skipped"]
    assert skipped["occurrence"] == wire(start + DAY)
    assert skipped["reason"]["reservations"][0]["rule"] == "too_few_free"
    assert skipped["offers"]  # the refusal a lease gets, counter-offers included
    nothing = http.post(
        "/v1/lease-series",
        json=series_body("none-fit", at, "FREQ=WEEKLY;COUNT=1", conflicts="skip"),
    )
    assert nothing.status_code == 409, nothing.text  # skipping every occurrence creates nothing
    assert [c["occurrence"] for c in nothing.json()["conflicts"]] == [wire(at)]
    leases = http.get("/v1/leases").json()["leases"]
    assert sorted(lease["name"] for lease in leases) == sorted(
        ["blocker", *("best-" + (start + n * DAY).strftime("%Y%m%dT%H%M%SZ") for n in (0, 2))]
    )


def test_one_occurrence_is_edited_and_another_cancelled_on_its_own(http: httpx.Client) -> None:
    start = tomorrow()
    series = created(
        http.post("/v1/lease-series", json=series_body("edit", start, "FREQ=WEEKLY;COUNT=3"))
    )["series"]
    first, second, third = (o["lease_id"] for o in series["occurrences"])
    moved_start = start + 7 * DAY + 2 * HOUR
    response = http.put(
        f"/v1/leases/{second}",
        json={"start_date": iso(moved_start), "end_date": iso(moved_start + 3 * HOUR)},
    )
    assert response.status_code == 200, response.text
    assert response.json()["lease"]["occurrence"] == wire(start + 7 * DAY)
    assert http.delete(f"/v1/leases/{third}").status_code == 204
    shown = http.get(f"/v1/lease-series/{series['id']}").json()["series"]
    assert [o["lease_id"] for o in shown["occurrences"]] == [first, second]
    assert shown["occurrences"][1]["start_date"] == wire(moved_start)
    assert shown["occurrences"][1]["occurrence"] == wire(start + 7 * DAY)
    assert shown["occurrences"][0]["start_date"] == wire(start)
    assert shown["cancelled"] == [wire(start + 14 * DAY)]
    # The cancelled occurrence's window is free again, and the series does not take it back.
    freed = start + 14 * DAY
    created(http.post("/v1/leases", json=lease_body("mine-now", freed, freed + HOUR)))
    again = http.get(f"/v1/lease-series/{series['id']}").json()["series"]
    assert again["cancelled"] == [wire(start + 14 * DAY)]


def test_deleting_a_series_cancels_what_has_not_ended_and_keeps_what_has(
    live: LiveServer, http: httpx.Client
) -> None:
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)
    series = created(
        http.post(
            "/v1/lease-series",
            json={
                **series_body("short", start, "FREQ=DAILY;COUNT=3"),
                "end_date": iso(start + dt.timedelta(seconds=2)),
            },
        )
    )["series"]
    ended, later, last = (o["lease_id"] for o in series["occurrences"])
    deadline = time.monotonic() + 20
    while http.get(f"/v1/leases/{ended}").json()["lease"]["status"] != "TERMINATED":
        assert time.monotonic() < deadline, "the first occurrence never ended"
        time.sleep(0.1)
    assert http.delete(f"/v1/lease-series/{series['id']}").status_code == 204
    assert http.get(f"/v1/lease-series/{series['id']}").status_code == 404
    assert http.get(f"/v1/leases/{ended}").json()["lease"]["status"] == "TERMINATED"
    for cancelled in (later, last):
        assert http.get(f"/v1/leases/{cancelled}").status_code == 404
    at = start + DAY
    created(http.post("/v1/leases", json=lease_body("free-again", at, at + HOUR)))
    with live.ctx.db.reader() as session:
        actions = session.scalars(
            select(AuditLog.action).where(AuditLog.target_id == series["id"]).order_by(AuditLog.id)
        )
        assert list(actions) == ["series.create", "series.delete"]
    assert http.delete(f"/v1/lease-series/{series['id']}").status_code == 404


def test_another_projects_series_is_not_found(http: httpx.Client) -> None:
    series = created(
        http.post("/v1/lease-series", json=series_body("mine", tomorrow(), "FREQ=DAILY;COUNT=2"))
    )["series"]
    url = f"/v1/lease-series/{series['id']}"
    assert http.get(url, headers=BOB).status_code == 404
    assert http.delete(url, headers=BOB).status_code == 404
    listed = http.get("/v1/lease-series", headers=BOB).json()["series"]
    assert {s["project_id"] for s in listed} <= {"project-b"}
    assert http.get("/v1/lease-series?project_id=project-a", headers=BOB).json()["series"] == []
    everyone = http.get("/v1/lease-series", headers=ADMIN).json()["series"]
    assert series["id"] in {s["id"] for s in everyone}
    assert http.get(url, headers=ADMIN).status_code == 200
    assert http.get(url).status_code == 200


def next_weekday(when: dt.datetime) -> str:
    """The iCalendar name of the day after ``when``'s."""
    return ("MO", "TU", "WE", "TH", "FR", "SA", "SU")[(when.weekday() + 1) % 7]


def bad_series() -> list[tuple[str, Callable[[dt.datetime], dict[str, Any]], str]]:
    def rule(text: str) -> Callable[[dt.datetime], dict[str, Any]]:
        return lambda start: {"rrule": text}

    return [
        ("unbounded", rule("FREQ=DAILY"), "rrule"),
        ("count-and-until", rule("FREQ=DAILY;COUNT=2;UNTIL=20990101T000000Z"), "rrule"),
        ("too-many", rule("FREQ=DAILY;COUNT=101"), "rrule"),
        ("hourly", rule("FREQ=HOURLY;COUNT=2"), "rrule"),
        ("by-hour", rule("FREQ=DAILY;COUNT=2;BYHOUR=3"), "rrule"),
        ("nonsense", rule("every tuesday"), "rrule"),
        ("bad-count", rule("FREQ=DAILY;COUNT=two"), "rrule"),
        ("count-zero", rule("FREQ=DAILY;COUNT=0"), "rrule"),
        ("interval-zero", rule("FREQ=DAILY;INTERVAL=0;COUNT=3"), "rrule"),
        ("interval-negative", rule("FREQ=DAILY;INTERVAL=-1;COUNT=3"), "rrule"),
        ("ninth-tuesday-of-a-month", rule("FREQ=MONTHLY;BYDAY=+9TU;COUNT=2"), "rrule"),
        ("sixth-tuesday-of-a-month", rule("FREQ=MONTHLY;BYDAY=-6TU;COUNT=2"), "rrule"),
        ("60th-tuesday-of-a-year", rule("FREQ=YEARLY;BYDAY=60TU;COUNT=2"), "rrule"),
        ("never", rule("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30;COUNT=2"), "rrule"),
        ("local-until", rule("FREQ=DAILY;UNTIL=20990101"), "rrule"),
        ("not-a-string", lambda start: {"rrule": 7}, "rrule"),
        (
            "start-off-rule",
            lambda start: {"rrule": f"FREQ=WEEKLY;BYDAY={next_weekday(start)};COUNT=2"},
            "start_date",
        ),
        ("exdate-not-a-date", lambda start: {"exdates": ["soon"]}, "exdates[0]"),
        ("exdates-not-a-list", lambda start: {"exdates": iso(start)}, "exdates"),
        (
            "exdate-off-rule",
            lambda start: {"exdates": [iso(start + DAY + HOUR)]},
            "exdates[0]",
        ),
        (
            "exdate-twice",
            lambda start: {"exdates": [iso(start + DAY), iso(start + DAY)]},
            "exdates[1]",
        ),
        (
            "exdates-everything",
            lambda start: {"exdates": [iso(start + n * DAY) for n in range(3)]},
            "exdates",
        ),
        ("conflicts", lambda start: {"conflicts": "maybe"}, "conflicts"),
        ("no-end", lambda start: {"end_date": None, "duration": None}, "end_date"),
        ("end-before-start", lambda start: {"end_date": iso(start - HOUR)}, "end_date"),
        ("duration", lambda start: {"end_date": None, "duration": "soon"}, "duration"),
        ("reminder-too-long", lambda start: {"reminders": ["PT2H"]}, "reminders[0]"),
        ("no-reservations", lambda start: {"reservations": []}, "reservations"),
        ("bad-min", lambda start: {"reservations": [{**HOST, "min": 0}]}, "reservations[0].min"),
        ("long-name", lambda start: {"name": "x" * 64}, "name"),
        ("past", lambda start: {"start_date": iso(start - 5 * DAY)}, "start_date"),
        ("unknown", lambda start: {"colour": "blue"}, "colour"),
    ]


@pytest.mark.parametrize(
    ("change", "field"), [(b[1], b[2]) for b in bad_series()], ids=[b[0] for b in bad_series()]
)
def test_a_bad_series_is_refused_naming_the_field(
    live: LiveServer,
    http: httpx.Client,
    change: Callable[[dt.datetime], dict[str, Any]],
    field: str,
) -> None:
    start = tomorrow()
    body = series_body("bad", start, "FREQ=DAILY;COUNT=3")
    body.update(change(start))
    if body.get("start_date") != iso(start):  # a past start: the rule starts there too
        body["end_date"] = iso(start - 5 * DAY + HOUR)
    body = {k: v for k, v in body.items() if v is not None}
    before = counts(live.ctx)
    response = http.post("/v1/lease-series", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text
    assert counts(live.ctx) == before


def test_occurrences_are_the_rules_expansion_and_a_refusal_writes_nothing(
    ctx: ServiceContext, hosts: HostService
) -> None:
    """Against dateutil: every occurrence of the rule, less the exdates, becomes a lease at its
    instant when all fit; with some blocked by other leases, ``reject`` leaves every table as
    it was and ``skip`` leaves out exactly the blocked ones (or refuses too if none fits)."""
    add_hosts(hosts, 1)
    leases = LeaseService(ctx)
    service = SeriesService(ctx, leases)
    host = ReservationRequest(
        "physical:host", {k: v for k, v in HOST.items() if k != "resource_type"}
    )

    @settings(max_examples=15, deadline=None)
    @given(
        freq=st.sampled_from(["DAILY", "WEEKLY", "MONTHLY"]),
        interval=st.integers(1, 3),
        count=st.integers(1, 6),
        data=st.data(),
    )
    def check(freq: str, interval: int, count: int, data: st.DataObject) -> None:
        start = T0 + DAY + dt.timedelta(minutes=data.draw(st.integers(0, 600)))
        rule = f"FREQ={freq};INTERVAL={interval};COUNT={count}"
        expansion = list(rrulestr(rule, dtstart=start))
        exdates = data.draw(st.lists(st.sampled_from(expansion), unique=True, max_size=count - 1))
        kept = [at for at in expansion if at not in exdates]
        blocked = data.draw(st.lists(st.sampled_from(kept), unique=True, max_size=2))
        blockers = [
            leases.create(ALICE_ACTOR, host_request(f"block-{uuid.uuid4().hex[:8]}", at, at + HOUR))
            for at in blocked
        ]
        request = SeriesRequest(
            name=f"s-{uuid.uuid4().hex[:8]}",
            start=start,
            duration=HOUR,
            rrule=rule,
            exdates=exdates,
            reservations=[host],
        )
        fitting = [at for at in kept if at not in blocked]
        try:
            if blocked:
                before = counts(ctx)
                for conflicts in (Conflicts.REJECT, Conflicts.SKIP)[: 1 + (not fitting)]:
                    with pytest.raises(NotEnoughCapacity) as refused:
                        service.create(
                            ALICE_ACTOR, dataclasses.replace(request, conflicts=conflicts)
                        )
                    listed = [c["occurrence"] for c in refusal_body(refused.value)["conflicts"]]
                    assert listed == [wire(at) for at in sorted(blocked)]
                    assert counts(ctx) == before
                if not fitting:
                    return
                request = dataclasses.replace(request, conflicts=Conflicts.SKIP)
            view = service.create(ALICE_ACTOR, request)
            assert [lease.occurrence for lease in view.leases] == fitting
            assert [lease.start_date for lease in view.leases] == fitting
            assert [s.occurrence for s in view.skipped] == sorted(blocked)
            service.delete(ALICE_ACTOR, view.series.id)
        finally:
            for blocker in blockers:
                leases.delete(ALICE_ACTOR, blocker.id)

    check()


def test_series_commands(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "compute-0", *url)
    as_a = (*url, "--project", "project-a")
    start = tomorrow()
    made = run_json(
        "series",
        "create",
        "cli-series",
        "--start",
        start.strftime("%Y-%m-%d %H:%M"),
        "--duration",
        "01:00",
        "--rrule",
        "FREQ=DAILY;COUNT=3",
        "--exdate",
        iso(start + DAY),
        "--min",
        "1",
        "--reminder",
        "PT10M",
        *as_a,
    )
    series = made["series"]
    assert [o["occurrence"] for o in series["occurrences"]] == [wire(start), wire(start + 2 * DAY)]
    assert [s["id"] for s in run_json("series", "list", *as_a)] == [series["id"]]
    table = run("series", "show", series["id"], *as_a).stdout
    assert "cli-series" in table and "occurrence" in table
    assert run_json("series", "show", series["id"], *as_a)["series"]["id"] == series["id"]
    # By name: the list it is found in is never paged (a marker used to loop on it forever).
    assert run_json("series", "show", "cli-series", *as_a)["series"]["id"] == series["id"]
    refused = run(
        "series",
        "create",
        "clash",
        "--start",
        iso(start),
        "--duration",
        "PT1H",
        "--rrule",
        "FREQ=DAILY;COUNT=1",
        *as_a,
        ok=False,
    )
    assert "error (409)" in refused.stderr
    bad = run(
        "series",
        "create",
        "bad",
        "--start",
        iso(start),
        "--end",
        iso(start + HOUR),
        "--rrule",
        "FREQ=DAILY",
        *as_a,
        ok=False,
    )
    assert "error (400)" in bad.stderr and "rrule" in bad.stderr
    deleted = run("series", "delete", series["id"], *as_a).stdout
    assert series["id"] in deleted
    assert run_json("series", "list", *as_a) == []
    assert json.loads(run("lease", "list", *as_a, "--json").stdout) == []


def test_series_create_takes_a_reservation_of_any_type(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("device", "create", "fpga-0", *url)
    as_a = (*url, "--project", "project-a")
    start = tomorrow()
    every_day = ("--start", iso(start), "--duration", "PT1H", "--rrule", "FREQ=DAILY;COUNT=2")
    fpga = ("--reservation", "resource_type=device,min=1,max=1")
    made = run_json("series", "create", "fpga", *every_day, *fpga, *as_a)["series"]
    assert [r["resource_type"] for r in made["reservations"]] == ["device"]
    assert len(made["occurrences"]) == 2
    lease = run_json("lease", "show", made["occurrences"][0]["lease_id"], *as_a)
    assert [r["resource_type"] for r in lease["reservations"]] == ["device"]
    both = run("series", "create", "both", *every_day, *fpga, "--min", "2", *as_a, ok=False)
    assert "--reservation replaces" in both.stderr and "Traceback" not in both.stderr


def call_series_operations(call: Any) -> None:
    """Every /v1/lease-series operation once, for tests/test_openapi.py."""
    member = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
    body = {
        "name": "series",
        "start_date": "2034-01-03 10:00",
        "end_date": "2034-01-03 11:00",
        "rrule": "FREQ=WEEKLY;COUNT=3",
        "exdates": ["2034-01-10 10:00"],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "reminders": ["PT10M"],
    }
    made = call("POST", "/v1/lease-series", 201, json=body, headers=member).json()["series"]
    call("POST", "/v1/lease-series", 409, json=body, headers=member)  # the name is taken
    call("POST", "/v1/lease-series", 400, json={**body, "rrule": "FREQ=DAILY"}, headers=member)
    call("GET", "/v1/lease-series", 200, headers=member)
    at = {"series_id": made["id"]}
    call("GET", "/v1/lease-series/{series_id}", 200, at=at, headers=member)
    call("DELETE", "/v1/lease-series/{series_id}", 204, at=at, headers=member)
    call("GET", "/v1/lease-series/{series_id}", 404, at=at, headers=member)


def test_a_series_name_is_taken_once_per_project(http: httpx.Client) -> None:
    body = series_body("twice", tomorrow(), "FREQ=DAILY;COUNT=1")
    created(http.post("/v1/lease-series", json=body))
    elsewhen = series_body("twice", tomorrow() + DAY, "FREQ=DAILY;COUNT=1")
    again = http.post("/v1/lease-series", json=elsewhen)
    assert again.status_code == 409, again.text
    assert again.json()["error_message"].startswith("name: ")
    other = created(http.post("/v1/lease-series", json=elsewhen, headers=BOB))
    assert other["series"]["project_id"] == "project-b"
