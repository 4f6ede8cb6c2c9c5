"""``GET /v1/leases.ics``: a project's leases as an iCalendar feed that a calendar parses."""

from __future__ import annotations

import datetime as dt

import httpx
import icalendar

from climate.api import ics
from climate.config import Settings
from tests.conftest import LiveServer
from tests.test_auth import assert_error, client, created, issue, token_server
from tests.ui.test_timeline_data import ALICE, BOB, lease_body

TRICKY = "semi;colon, comma \\ back <b>x</b> " + "é" * 40


def events(response: httpx.Response) -> dict[str, icalendar.Event]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/calendar; charset=utf-8"
    assert all(len(line.encode()) <= 75 for line in response.text.split("\r\n"))
    assert response.text.endswith("END:VCALENDAR\r\n")
    calendar = icalendar.Calendar.from_ical(response.text)
    return {str(e["UID"]): e for e in calendar.walk("VEVENT")}


def test_a_member_gets_their_projects_leases(live: LiveServer) -> None:
    with client(live) as admin, client(live, ALICE) as alice, client(live, BOB) as bob:
        created(admin.post("/v1/os-hosts", json={"name": "compute-1"}), "host")
        created(admin.post("/v1/os-hosts", json={"name": "compute-2"}), "host")
        mine = created(alice.post("/v1/leases", json=lease_body(TRICKY, 1)), "lease")
        theirs = created(bob.post("/v1/leases", json=lease_body("bob's", 1)), "lease")
        feed = events(alice.get("/v1/leases.ics"))
        assert events(alice.get("/v1/leases.ics", params={"project_id": "project-b"})) == {}
        everything = events(admin.get("/v1/leases.ics"))
        only_bob = events(admin.get("/v1/leases.ics", params={"project_id": "project-b"}))
    assert list(feed) == [f"{mine['id']}@climate"]
    event = feed[f"{mine['id']}@climate"]
    assert str(event["SUMMARY"]) == TRICKY
    assert event.decoded("DTSTART") == dt.datetime(2030, 1, 2, 12, 0, tzinfo=dt.UTC)
    assert event.decoded("DTEND") == dt.datetime(2030, 1, 3, 12, 0, tzinfo=dt.UTC)
    assert str(event["STATUS"]) == "TENTATIVE"
    assert "project project-a" in str(event["DESCRIPTION"])
    assert set(everything) == {f"{mine['id']}@climate", f"{theirs['id']}@climate"}
    assert list(only_bob) == [f"{theirs['id']}@climate"]


def test_text_is_escaped_and_lines_folded() -> None:
    assert ics.text("a;b,c\\d\ne") == "a\\;b\\,c\\\\d\\ne"
    folded = ics._folded("SUMMARY:" + "é" * 60)
    lines = folded.split("\r\n ")
    assert all(len(line.encode()) <= 75 for line in lines)
    assert "".join(lines) == "SUMMARY:" + "é" * 60


def test_the_feed_wants_a_token_in_token_mode(settings: Settings, sqlite_url: str) -> None:
    with token_server(settings, sqlite_url) as server:
        member = issue(server, "alice", "project-a", ["member"])
        with client(server) as anonymous:
            assert_error(anonymous.get("/v1/leases.ics"), 401)
        with client(server, {"X-Auth-Token": member}) as alice:
            assert events(alice.get("/v1/leases.ics")) == {}
