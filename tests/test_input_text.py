"""What a request may carry besides bounded integers: no control characters in names, keys and
descriptions, each JSON key once, a boolean called a boolean; and what was stored before these
checks existed neither breaks an update nor reaches a terminal through the CLI."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import pytest

from climate.db import hosts as host_rows
from climate.db.tables import Host, Lease, Reservation
from climate.errors import InvalidInput
from climate.services.tokens import TokenService
from tests.conftest import LiveServer
from tests.test_api_errors import assert_error, client
from tests.test_cli import run, run_json

ESCAPE = "\u001b]0;pwn\u0007"
"""Sets a terminal's window title."""


def _date(days: float) -> str:
    when = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    return when.strftime("%Y-%m-%d %H:%M")


def _lease(name: str, start: float = 1, end: float = 2, **host: Any) -> dict[str, Any]:
    reservation = {"resource_type": "physical:host", "min": 1, "max": 1, **host}
    return {
        "name": name,
        "start_date": _date(start),
        "end_date": _date(end),
        "reservations": [reservation],
    }


def _raw(http: httpx.Client, method: str, path: str, text: str) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return http.request(method, path, content=text.encode(), headers=headers)


def test_a_boolean_where_an_integer_is_required_is_called_a_boolean(live: LiveServer) -> None:
    with client(live) as http:
        http.post("/v1/os-hosts", json={"name": "c0"}).raise_for_status()
        for field in ("min", "max"):
            response = http.post("/v1/leases", json=_lease("l", **{field: True}))
            assert_error(
                response,
                400,
                f"reservations[0].{field}: Malformed parameter {field} (is a boolean (true) where "
                "an integer",
            )


@pytest.mark.parametrize(
    ("method", "path", "text", "key"),
    [
        ("POST", "/v1/leases", '{"name": "a", "name": "b"}', "name"),
        (
            "POST",
            "/v1/leases",
            '{"name": "a", "end_date": "2031-01-01 10:00", "reservations": '
            '[{"resource_type": "physical:host", "min": 1, "max": 1, "max": 10}]}',
            "max",
        ),
        (
            "POST",
            "/v1/leases",
            '{"name": "a", "hold": {"expires_in": 1, "expires_in": 2}}',
            "expires_in",
        ),
        ("POST", "/v1/os-hosts", '{"name": "c9", "rack": "r1", "rack": "r2"}', "rack"),
        ("POST", "/v1/availability", '{"limit": 1, "limit": 2}', "limit"),
        ("PUT", "/v1/leases/x", '{"name": "a", "name": "b"}', "name"),
    ],
)
def test_a_key_given_twice_is_refused_at_any_depth(
    live_sqlite: LiveServer, method: str, path: str, text: str, key: str
) -> None:
    with client(live_sqlite) as http:
        response = _raw(http, method, path, text)
        assert_error(response, 400, f"{key}: given twice")
        assert http.get("/v1/leases").json()["leases"] == []


def test_control_characters_are_refused_in_names_keys_and_values(live: LiveServer) -> None:
    with client(live) as http:
        host = http.post("/v1/os-hosts", json={"name": "c0"}).json()["host"]
        lease = http.post("/v1/leases", json=_lease("fine")).json()["lease"]
        path = f"/v1/leases/{lease['id']}"
        for name in (ESCAPE, "a\tb", "a\nb", "a\u009bb", "a\u007fb"):
            assert_error(http.post("/v1/leases", json=_lease(name)), 400, "name: must not contain")
            assert_error(http.put(path, json={"name": name}), 400, "name: must not contain")
        assert http.get(path).json()["lease"]["name"] == "fine"
        hosts = "/v1/os-hosts"
        refused = [
            (hosts, {"name": "c1", "a\u0001b": "x"}, "'a\\x01b': must not contain"),
            (hosts, {"name": "c1", "rack": "r\u001b[31m"}, "rack: must not contain"),
            (hosts, {"name": "c\u001b1"}, "name: must not contain"),
            (f"{hosts}/{host['id']}", {"rack": "r\n1"}, "rack: must not contain"),
            ("/v1/volume-pools", {"name": "p\u00071", "capacity_gb": 1}, "name: must not"),
            ("/v1/devices", {"name": "gpu\r0"}, "name: must not contain"),
            (
                "/v1/lease-series",
                {**_lease(ESCAPE), "rrule": "FREQ=DAILY;COUNT=2", "duration": 60},
                "name: must not contain",
            ),
            (
                "/v1/leases",
                _lease("q", resource_properties='["==", "$rack", "\u001b"]'),
                "reservations[0].resource_properties: must not contain",
            ),
        ]
        for target, body, message in refused:
            send = http.put if target.startswith(f"{hosts}/") else http.post
            assert_error(send(target, json=body), 400, message)
        assert [h["hypervisor_hostname"] for h in http.get(hosts).json()["hosts"]] == ["c0"]
        properties = http.get(f"{hosts}/properties").json()["resource_properties"]
        assert properties == []
        # Line feeds and tabs are fine where text may span lines: a JSON query, a template.
        spread = '[\n\t"==", "$rack", "r1"\n]'
        created = http.post("/v1/leases", json=_lease("lines", 3, 4, resource_properties=spread))
        assert created.status_code == 409, created.text  # no host has rack r1: parsed, refused


def test_lone_surrogates_are_refused_naming_the_field_not_answered_500(live: LiveServer) -> None:
    """JSON's ``\\ud800`` alone decodes to half a UTF-16 pair: text no answer, log line or
    database can encode. It was let through, and the error naming it (a date, a query) failed
    to encode into a 500."""
    half = "\\ud800"
    with client(live) as http:
        host = http.post("/v1/os-hosts", json={"name": "s0"}).json()["host"]
        lease = http.post("/v1/leases", json=_lease("fine")).json()["lease"]
        path = f"/v1/leases/{lease['id']}"
        base = (
            '{"name": "s", "start_date": "%s", "end_date": "%s", '
            '"reservations": [{"resource_type": "physical:host", "min": 1, "max": 1%s}]}'
        )
        start, end = _date(1), _date(2)
        sent = [
            ("POST", "/v1/leases", base % (half, end, ""), "start_date: must not contain"),
            ("POST", "/v1/leases", base % (start, half, ""), "end_date: must not contain"),
            (
                "POST",
                "/v1/leases",
                base % (start, end, f', "resource_properties": "{half}"'),
                "reservations[0].resource_properties: must not contain",
            ),
            ("PUT", path, f'{{"name": "a{half}"}}', "name: must not contain"),
            ("PUT", path, f'{{"end_date": "{half}"}}', "end_date: must not contain"),
            ("POST", "/v1/os-hosts", f'{{"name": "h{half}"}}', "name: must not contain"),
            ("POST", "/v1/os-hosts", f'{{"name": "h", "{half}": "x"}}', "'\\ud800': must not"),
            ("PUT", f"/v1/os-hosts/{host['id']}", f'{{"rack": "{half}"}}', "rack: must not"),
        ]
        for method, target, text, message in sent:
            assert_error(_raw(http, method, target, text), 400, message)
        assert http.get(path).json()["lease"]["name"] == "fine"


def test_control_characters_are_refused_in_token_names(live_sqlite: LiveServer) -> None:
    tokens = TokenService(live_sqlite.ctx)
    for name, user, project in ((ESCAPE, "u", "p"), ("ci", "u\u0007", "p"), ("ci", "u", "p\n")):
        with pytest.raises(InvalidInput, match="must not contain control characters"):
            tokens.issue(name, user, project, ["member"])


def test_a_lease_stored_with_a_huge_max_is_refused_with_409_not_500(live: LiveServer) -> None:
    """A lease admitted before counts were bounded (written to the database as it was then):
    a refused update explains itself (counter-offers included) instead of overflowing."""
    with client(live) as http:
        for name in ("c0", "c1"):
            http.post("/v1/os-hosts", json={"name": name}).raise_for_status()
        big = http.post("/v1/leases", json=_lease("big", 1, 2)).json()["lease"]
        with live.ctx.db.transaction() as session:
            row = session.get(Reservation, big["reservations"][0]["id"])
            assert row is not None
            row.params = {**row.params, "max": 10**30}
        later = http.post("/v1/leases", json=_lease("later", 3, 4, min=2, max=2))
        assert later.status_code == 201, later.text
        response = http.put(f"/v1/leases/{big['id']}", json={"end_date": _date(5)})
        assert_error(response, 409)
        assert "reason" in response.json(), response.json()


def test_the_cli_escapes_control_characters_the_server_sends(live_sqlite: LiveServer) -> None:
    """A name and a property stored before they were checked (written to the database as
    they were then): whatever the CLI prints shows them escaped, never raw."""
    url = ("--url", live_sqlite.url)
    with client(live_sqlite) as http:
        host = http.post("/v1/os-hosts", json={"name": "c0"}).json()["host"]
        lease = http.post("/v1/leases", json=_lease("plain")).json()["lease"]
    with live_sqlite.ctx.db.transaction() as session:
        stored = session.get(Lease, lease["id"])
        assert stored is not None
        stored.name = ESCAPE
        row = session.get(Host, host["id"])
        assert row is not None
        host_rows.set_properties(session, row, {"a\u0001b": "red\u001b[31m\u009b2J"})
    printed = [
        run("lease", "list", *url),
        run("lease", "show", lease["id"], *url),
        run("lease", "list", "--json", *url),
        run("host", "show", str(host["id"]), *url),
        run("host", "list", "--json", *url),
    ]
    for done in printed:
        for control in ("\u001b", "\u0007", "\u0001", "\u009b"):
            assert control not in done.stdout + done.stderr, (done.args, done.stdout)
    assert "\\x1b]0;pwn\\x07" in printed[0].stdout
    assert "a\\x01b" in printed[3].stdout and "red\\x1b[31m\\x9b2J" in printed[3].stdout
    assert run_json("lease", "list", *url)[0]["name"] == ESCAPE  # JSON escapes; scripts get it
