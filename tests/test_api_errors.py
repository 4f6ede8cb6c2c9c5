"""Bad input on every endpoint, over real HTTP: a 4xx with Blazar's error body, nothing written.

Every refusal must name the offending field in ``error_message`` and leave the database exactly
as it was (no lease, reservation, event, allocation or outbox row half-written).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from climate.config import Settings, load_settings
from tests.conftest import LiveServer, serve

ERROR_KEYS = {"error_code", "error_message", "error_name"}
REFUSAL_KEYS = {"reason", "offers"}
COUNTED_TABLES = (
    "leases",
    "reservations",
    "events",
    "host_allocations",
    "outbox",
    "hosts",
    "host_properties",
    "resource_properties",
)


# -- helpers -------------------------------------------------------------------------------------


def fmt(when: dt.datetime) -> str:
    """Blazar's request date format (UTC, minutes)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")


def wire(when: dt.datetime) -> str:
    """How a lease date comes back on the wire."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


def soon(days: float = 1, hours: float = 0) -> dt.datetime:
    """A future time on the real clock, on a whole minute."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    return now + dt.timedelta(days=days, hours=hours)


def reservation(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "resource_type": "physical:host",
        "min": 1,
        "max": 1,
        "hypervisor_properties": "",
        "resource_properties": "",
    }
    body.update(overrides)
    return body


def lease_body(name: str = "lease-1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "start_date": fmt(soon(1)),
        "end_date": fmt(soon(2)),
        "reservations": [reservation()],
        "events": [],
    }
    body.update(overrides)
    return body


@contextlib.contextmanager
def client(server: LiveServer, **headers: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        yield http


def assert_error(response: httpx.Response, status: int, *mentions: str) -> dict[str, Any]:
    """Blazar's error body with ``status``, whose message names every one of ``mentions``."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    # A capacity refusal also explains itself (docs/admission.md); nothing else adds keys.
    explained = status == 409 and REFUSAL_KEYS <= set(body)
    # A routing error (no such path, or method) also carries Blazar's Flask key ``error``.
    routing = {"error"} if status in (404, 405) and body.get("error") == status else set()
    assert set(body) - (REFUSAL_KEYS if explained else routing) == ERROR_KEYS, body
    assert body["error_code"] == status
    assert body["error_name"] == status  # as Blazar: the status again
    for mention in mentions:
        assert mention in body["error_message"], (mention, body)
    return body


def row_counts(server: LiveServer) -> dict[str, int]:
    with server.ctx.db.reader() as session:
        return {
            table: int(session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
            for table in COUNTED_TABLES
        }


def snapshot(server: LiveServer, http: httpx.Client) -> tuple[Any, ...]:
    """Everything a refused request must leave alone: what the API shows and the raw rows."""
    leases = http.get("/v1/leases")
    allocations = http.get("/v1/os-hosts/allocations")
    hosts = http.get("/v1/os-hosts")
    assert leases.status_code == allocations.status_code == hosts.status_code == 200
    return leases.json(), allocations.json(), hosts.json(), row_counts(server)


def add_host(http: httpx.Client, name: str, **props: Any) -> dict[str, Any]:
    response = http.post("/v1/os-hosts", json={"name": name, **props})
    assert response.status_code == 201, response.text
    host: dict[str, Any] = response.json()["host"]
    return host


def create_lease(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/leases", json=body)
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def get_lease(http: httpx.Client, lease_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/leases/{lease_id}")
    assert response.status_code == 200, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def wait_for_status(http: httpx.Client, lease_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        lease = get_lease(http, lease_id)
        if lease["status"] == status:
            return lease
        if time.monotonic() > deadline:
            raise AssertionError(f"lease {lease_id} stuck in {lease['status']}, not {status}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shared(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One SQLite server for a module's refusal cases: they must not write, and each checks it."""
    target = tmp_path_factory.mktemp("shared") / "climate.db"
    shutil.copy(sqlite_template, target)
    settings = load_settings(env={}, event_retry_base_seconds=0.0)
    with serve(settings, f"sqlite:///{target}") as server, client(server) as http:
        add_host(http, "compute-0", gpu="a100")
        add_host(http, "compute-1", gpu="v100")
        yield server


@pytest.fixture
def shared_api(shared: LiveServer) -> Iterator[httpx.Client]:
    with client(shared) as http:
        yield http


@pytest.fixture
def api(live_sqlite: LiveServer) -> Iterator[httpx.Client]:
    """An admin client (noauth, no identity headers) on a SQLite server with two hosts."""
    with client(live_sqlite) as http:
        add_host(http, "compute-0", gpu="a100")
        add_host(http, "compute-1", gpu="v100")
        yield http


# -- refused lease creates -----------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], object]


def _set(**fields: Any) -> Mutation:
    return lambda body: body.update(fields)


def _set_reservation(**fields: Any) -> Mutation:
    return lambda body: body["reservations"][0].update(fields)


def _drop(field: str) -> Mutation:
    return lambda body: body.pop(field)


def _drop_reservation(field: str) -> Mutation:
    return lambda body: body["reservations"][0].pop(field)


BAD_LEASES: list[tuple[str, Mutation, str]] = [
    ("min-not-a-number", _set_reservation(min="abc"), "reservations[0].min"),
    ("min-zero", _set_reservation(min=0), "reservations[0].min"),
    ("min-negative", _set_reservation(min=-1, max=1), "reservations[0].min"),
    ("min-float", _set_reservation(min=1.5), "reservations[0].min"),
    ("min-bool", _set_reservation(min=True), "reservations[0].min"),
    ("min-missing", _drop_reservation("min"), "reservations[0].min"),
    ("min-unicode-digit", _set_reservation(min="\u00b2"), "reservations[0].min"),
    ("min-5000-digits", _set_reservation(min="9" * 5000), "reservations[0].min"),
    ("min-above-max", _set_reservation(min=2, max=1), "reservations[0].max"),
    ("name-number", _set(name=123), "name"),
    ("name-missing", _drop("name"), "name"),
    ("name-empty", _set(name=""), "name"),
    ("name-blank", _set(name="   "), "name"),
    ("name-81-chars", _set(name="x" * 81), "name"),
    ("name-nul", _set(name="bad\u0000name"), "name"),
    ("reservations-not-a-list", _set(reservations={"min": 1}), "reservations"),
    ("reservations-string", _set(reservations="physical:host"), "reservations"),
    ("reservation-not-an-object", _set(reservations=["physical:host"]), "reservations[0]"),
    ("unknown-top-level-field", _set(colour="blue"), "colour"),
    ("end-missing", _drop("end_date"), "end_date"),
    ("end-not-a-date", _set(end_date="tomorrow"), "end_date"),
    ("end-number", _set(end_date=20310101), "end_date"),
    ("end-bad-month", _set(end_date="2031-13-01 10:00"), "end_date"),
    ("end-before-start", _set(start_date=fmt(soon(2)), end_date=fmt(soon(1))), "end_date"),
    ("end-equals-start", lambda body: body.update(start_date=body["end_date"]), "end_date"),
    ("end-year-9999", _set(end_date="9999-12-31 23:59"), "end_date"),
    ("end-overflows-utc", _set(end_date="9999-12-31T23:00:00-05:00"), "end_date"),
    ("start-in-the-past", _set(start_date="2001-01-01 00:00"), "start_date"),
    ("start-an-hour-ago", _set(start_date=fmt(soon(0, hours=-1))), "start_date"),
    ("start-underflows-utc", _set(start_date="0001-01-01T00:00:00+05:00"), "start_date"),
    ("start-not-a-date", _set(start_date="later"), "start_date"),
    ("before-end-date-not-a-date", _set(before_end_date="soon"), "before_end_date"),
    ("events-given", _set(events=[{"event_type": "start_lease"}]), "events"),
    (
        "unknown-resource-type",
        _set_reservation(resource_type="virtual:teleporter"),
        "reservations[0].resource_type",
    ),
    (
        "resource-type-not-a-string",
        _set_reservation(resource_type=["physical:host"]),
        "reservations[0].resource_type",
    ),
    (
        "resource-type-missing",
        _drop_reservation("resource_type"),
        "reservations[0].resource_type",
    ),
    (
        "resource-properties-bad-json",
        _set_reservation(resource_properties='["==", "$gpu"'),
        "reservations[0].resource_properties",
    ),
    (
        "resource-properties-unknown-operator",
        _set_reservation(resource_properties='["~=", "$gpu", "a100"]'),
        "reservations[0].resource_properties",
    ),
    (
        "resource-properties-not-a-property",
        _set_reservation(resource_properties='["==", "gpu", "a100"]'),
        "reservations[0].resource_properties",
    ),
    (
        "resource-properties-number",
        _set_reservation(resource_properties=5),
        "reservations[0].resource_properties",
    ),
    (
        "hypervisor-properties-unknown-operator",
        _set_reservation(hypervisor_properties='["like", "$memory_mb", "1"]'),
        "reservations[0].hypervisor_properties",
    ),
    ("before-end-unknown", _set_reservation(before_end="explode"), "reservations[0].before_end"),
    ("before-end-list", _set_reservation(before_end=["default"]), "reservations[0].before_end"),
    ("before-end-object", _set_reservation(before_end={"a": 1}), "reservations[0].before_end"),
]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [pytest.param(m, f, id=case) for case, m, f in BAD_LEASES],
)
def test_bad_lease_is_refused_naming_the_field_and_writes_nothing(
    shared: LiveServer, shared_api: httpx.Client, mutate: Mutation, field: str
) -> None:
    body = lease_body()
    mutate(body)
    before = snapshot(shared, shared_api)
    assert_error(shared_api.post("/v1/leases", json=body), 400, field)
    assert snapshot(shared, shared_api) == before


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        pytest.param(b'{"name": "x", ', 400, "body", id="malformed-json"),
        pytest.param(b"\xff\xfe\x00", 400, "body", id="not-utf8"),
        pytest.param(b"[]", 400, "body", id="json-array"),
        pytest.param(b'[{"name": "x"}]', 400, "body", id="array-of-lease"),
        pytest.param(b'"lease"', 400, "body", id="json-string"),
        pytest.param(b"null", 400, "body", id="json-null"),
        pytest.param(b"42", 400, "body", id="json-number"),
        pytest.param(b'{"a": ' * 5000 + b"1" + b"}" * 5000, 400, "body", id="deeply-nested"),
        pytest.param(b"", 400, "end_date", id="empty-body"),
        pytest.param(b"{}", 400, "end_date", id="empty-object"),
    ],
)
def test_unparseable_lease_body_is_refused(
    shared: LiveServer, shared_api: httpx.Client, raw: bytes, status: int, field: str
) -> None:
    before = snapshot(shared, shared_api)
    headers = {"Content-Type": "application/json"}
    assert_error(shared_api.post("/v1/leases", content=raw, headers=headers), status, field)
    assert snapshot(shared, shared_api) == before


def test_bad_input_with_nul_or_huge_numbers_is_a_4xx_on_every_database(
    live: LiveServer,
) -> None:
    """PostgreSQL refuses NUL in text and integers past int4: those must be 4xx, never 500."""
    with client(live) as http:
        host = add_host(http, "compute-0")
        before = snapshot(live, http)
        assert_error(http.post("/v1/leases", json=lease_body("a\u0000b")), 400, "name")
        assert_error(
            http.post(
                "/v1/leases",
                json=lease_body(reservations=[reservation(resource_properties="\u0000")]),
            ),
            400,
            "reservations[0].resource_properties",
        )
        assert_error(http.post("/v1/os-hosts", json={"name": "h\u0000"}), 400, "name")
        assert_error(
            http.post("/v1/os-hosts", json={"name": "h2", "rack": "r\u00001"}), 400, "rack"
        )
        assert_error(http.post("/v1/os-hosts", json={"name": "h2", "vcpus": 2**40}), 400, "vcpus")
        for vcpus in ("99999999999", "9" * 5000, "\u00b2"):
            response = http.post("/v1/os-hosts", json={"name": "h2", "vcpus": vcpus})
            assert_error(response, 400, "vcpus")
        assert_error(http.put(f"/v1/os-hosts/{host['id']}", json={"memory_mb": 2**31}), 400)
        for path in ("/v1/leases/a%00b", "/v1/leases?name=a%00b", "/v1/os-hosts?x=%00"):
            response = http.get(path)
            assert 400 <= response.status_code < 500, (path, response.text)
            assert set(response.json()) == ERROR_KEYS
        for host_id in ("9999999999", "9" * 5000, "-1", "1e3", "abc", "\u00b2", "\u0661"):
            assert_error(
                http.get(f"/v1/os-hosts/{host_id}"), 404, f"Object with {{'host_id': '{host_id}'}}"
            )
            assert_error(http.put(f"/v1/os-hosts/{host_id}", json={"vcpus": 1}), 404, host_id)
            assert_error(http.delete(f"/v1/os-hosts/{host_id}"), 404, host_id)
            assert_error(http.get(f"/v1/os-hosts/{host_id}/allocation"), 404, host_id)
        assert snapshot(live, http) == before


def test_values_at_the_limits_are_accepted(live: LiveServer) -> None:
    with client(live) as http:
        host = add_host(http, "h" * 255, rack="r" * 255, vcpus=2**31 - 1, memory_mb="0")
        assert (host["vcpus"], host["memory_mb"], host["rack"]) == (2**31 - 1, 0, "r" * 255)
        assert http.get(f"/v1/os-hosts/{host['id']}").json()["host"] == host
        name = "\u00e9" * 80  # 80 characters, 160 bytes
        lease = create_lease(http, lease_body(name, reservations=[reservation(min="1", max="1")]))
        assert lease["name"] == name
        assert (lease["reservations"][0]["min"], lease["reservations"][0]["max"]) == (1, 1)


def test_start_now_and_an_immediate_lease_s_omitted_start_are_accepted(api: httpx.Client) -> None:
    now = dt.datetime.now(dt.UTC)
    lease = create_lease(api, lease_body("now", start_date="now"))
    start = dt.datetime.fromisoformat(lease["start_date"]).replace(tzinfo=dt.UTC)
    assert abs(start - now) < dt.timedelta(seconds=30)
    body = lease_body("omitted", end_date=fmt(soon(1)), lease_type="immediate")
    del body["start_date"]
    assert create_lease(api, body)["name"] == "omitted"  # a type that starts now may leave it out


def test_a_scheduled_lease_names_its_start_as_blazar_asks(api: httpx.Client) -> None:
    body = lease_body("no-start")
    del body["start_date"]
    assert_error(api.post("/v1/leases", json=body), 400, "Missing parameter start_date")
    del body["name"]
    assert_error(api.post("/v1/leases", json=body), 400, "Missing parameter name, start_date")


def test_a_before_end_date_outside_the_lease_is_blazar_s_403(
    shared: LiveServer, shared_api: httpx.Client
) -> None:
    before = snapshot(shared, shared_api)
    for when in (soon(3), soon(2), soon(1)):  # after the end, at it, at the start
        body = lease_body("warned", before_end_date=fmt(when))
        assert_error(
            shared_api.post("/v1/leases", json=body),
            403,
            "before_end_date",
            "Datetime is out of lease limits",
        )
    assert snapshot(shared, shared_api) == before


def test_both_date_formats_are_accepted_and_stored_in_utc(live: LiveServer) -> None:
    year = dt.datetime.now(dt.UTC).year + 5
    with client(live) as http:
        add_host(http, "compute-0")
        lease = create_lease(
            http,
            lease_body(
                "offset",
                start_date=f"{year}-01-01T10:00:00+02:00",
                end_date=f"{year}-01-01 12:00",
                before_end_date=f"{year}-01-01T11:30:00Z",
            ),
        )
        assert lease["start_date"] == f"{year}-01-01T08:00:00.000000"
        assert lease["end_date"] == f"{year}-01-01T12:00:00.000000"
        times = {e["event_type"]: e["time"] for e in lease["events"]}
        assert times == {
            "start_lease": f"{year}-01-01T08:00:00.000000",
            "before_end_lease": f"{year}-01-01T11:30:00.000000",
            "end_lease": f"{year}-01-01T12:00:00.000000",
        }
        assert get_lease(http, lease["id"])["start_date"] == f"{year}-01-01T08:00:00.000000"
        (allocation,) = lease["reservations"][0]["allocations"]
        assert allocation["start_date"] == f"{year}-01-01T08:00:00.000000"

        response = http.put(
            f"/v1/leases/{lease['id']}",
            json={"end_date": f"{year}-01-01T09:00:00-05:00", "start_date": f"{year}-01-01 13:00"},
        )
        assert response.status_code == 200, response.text
        moved = response.json()["lease"]
        assert (moved["start_date"], moved["end_date"]) == (
            f"{year}-01-01T13:00:00.000000",
            f"{year}-01-01T14:00:00.000000",
        )
        second = create_lease(
            http,
            lease_body(
                "seconds",
                start_date=f"{year}-02-01 10:00:30",
                end_date=f"{year}-02-01T11:00:00.250000+00:00",
            ),
        )
        assert second["start_date"] == f"{year}-02-01T10:00:30.000000"
        assert second["end_date"] == f"{year}-02-01T11:00:00.250000"


def test_duplicate_lease_name_in_a_project_is_a_conflict(
    live_sqlite: LiveServer, api: httpx.Client
) -> None:
    first = create_lease(api, lease_body("dup", start_date=fmt(soon(1)), end_date=fmt(soon(2))))
    before = snapshot(live_sqlite, api)
    later = lease_body("dup", start_date=fmt(soon(3)), end_date=fmt(soon(4)))
    assert_error(api.post("/v1/leases", json=later), 409, "name", "dup")
    assert snapshot(live_sqlite, api) == before
    # Another project may use the name; and once deleted, the name is free again.
    other = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
    assert api.post("/v1/leases", json=later, headers=other).status_code == 201
    assert api.delete(f"/v1/leases/{first['id']}").status_code == 204
    assert create_lease(api, later)["name"] == "dup"
    # Renaming onto a taken name is a conflict too, and changes nothing.
    second = create_lease(api, lease_body("other", start_date=fmt(soon(5)), end_date=fmt(soon(6))))
    response = api.put(f"/v1/leases/{second['id']}", json={"name": "dup"})
    assert_error(response, 409, "name")
    assert get_lease(api, second["id"]) == second


def test_oversized_body_is_413_and_writes_nothing(settings: Settings, sqlite_url: str) -> None:
    small = settings.model_copy(update={"max_body_bytes": 1024})
    with serve(small, sqlite_url) as server, client(server) as http:
        add_host(http, "compute-0")
        before = snapshot(server, http)
        padded = lease_body("big", resource_padding="x" * 2000)
        response = http.post("/v1/leases", json=padded)
        assert_error(response, 413, "body", "1024")
        assert response.json()["error_name"] == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
            yield b'{"name": "big", "padding": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'"}'

        assert_error(http.post("/v1/leases", content=chunks()), 413, "body")
        assert_error(http.post("/v1/os-hosts", json={"name": "h", "pad": "z" * 2000}), 413)
        assert_error(http.put("/v1/os-hosts/1", json={"pad": "z" * 2000}), 413)
        assert snapshot(server, http) == before
        # Under the limit all is well.
        assert http.post("/v1/leases", json=lease_body("fits")).status_code == 201


def test_unknown_lease_is_404_on_every_method(api: httpx.Client) -> None:
    missing = "0b6f7c5e-3a7e-4c55-9d9e-1f5d2b6f0000"
    assert_error(api.get(f"/v1/leases/{missing}"), 404, missing)
    assert_error(api.put(f"/v1/leases/{missing}", json={"name": "x"}), 404, missing)
    assert_error(api.delete(f"/v1/leases/{missing}"), 404, missing)
    assert_error(api.get("/v1/leases/not-a-uuid"), 404, "not-a-uuid")
    assert_error(api.get("/v1/leases/" + "x" * 500), 404)


def test_a_lease_with_no_reservations_lives_as_in_blazar(api: httpx.Client) -> None:
    """Blazar creates a lease without reservations (201); it starts and ends like any
    other, can be moved and renamed, and is deleted. A reservation cannot be added to it by
    an update: as in Blazar, one without an id is refused."""
    body = lease_body("empty", start_date="now", end_date=fmt(soon(0, 1)), reservations=[])
    created = create_lease(api, body)
    assert created["reservations"] == []
    assert {e["event_type"] for e in created["events"]} == {
        "start_lease",
        "before_end_lease",
        "end_lease",
    }
    path = f"/v1/leases/{created['id']}"
    deadline = time.monotonic() + 10
    while get_lease(api, created["id"])["status"] != "ACTIVE":
        assert time.monotonic() < deadline, get_lease(api, created["id"])
        time.sleep(0.05)
    end = soon(0, 2)
    moved = api.put(path, json={"name": "empty-2", "end_date": fmt(end)})
    assert moved.status_code == 200, moved.text
    assert moved.json()["lease"]["end_date"] == wire(end)
    added = api.put(path, json={"reservations": [reservation()]})
    assert_error(added, 400, "Missing parameter reservation ID", "reservations[0].id")
    assert get_lease(api, created["id"])["reservations"] == []
    assert api.delete(path).status_code == 204
    assert api.get(path).status_code == 404


def test_host_errors(live_sqlite: LiveServer, api: httpx.Client) -> None:
    before = snapshot(live_sqlite, api)
    assert_error(api.post("/v1/os-hosts", json={}), 400, "name")
    assert_error(api.post("/v1/os-hosts", json={"vcpus": 4}), 400, "name")
    assert_error(api.post("/v1/os-hosts", json={"name": ""}), 400, "name")
    assert_error(api.post("/v1/os-hosts", json={"name": 7}), 400, "name")
    assert_error(api.post("/v1/os-hosts", json={"name": "h" * 256}), 400, "name")
    assert_error(api.post("/v1/os-hosts", json={"name": "compute-0"}), 409, "name", "compute-0")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "gpu": {"model": "a100"}}), 400, "gpu")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "gpu": ["a100"]}), 400, "gpu")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "gpu": None}), 400, "gpu")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "vcpus": "many"}), 400, "vcpus")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "vcpus": -1}), 400, "vcpus")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "vcpus": 1.5}), 400, "vcpus")
    assert_error(
        api.post("/v1/os-hosts", json={"name": "n", "reservable": "yes"}), 400, "reservable"
    )
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "id": "9"}), 400, "id")
    # Blazar's limit and words for a new host's extra capability names: 64 characters.
    too_long = {"name": "n", "x" * 65: "1"}
    assert_error(api.post("/v1/os-hosts", json=too_long), 400, "Extra capability key too long")
    assert_error(api.post("/v1/os-hosts", json={"name": "n", "rack": "r" * 256}), 400, "rack")
    assert_error(api.post("/v1/os-hosts", content=b"[1]"), 400, "body")
    assert_error(api.post("/v1/os-hosts", content=b"{name"), 400, "body")

    host_id = api.get("/v1/os-hosts").json()["hosts"][0]["id"]
    assert_error(api.put(f"/v1/os-hosts/{host_id}", json={}), 400, "body", "No data to update")
    assert_error(api.put(f"/v1/os-hosts/{host_id}", json={"gpu": {"a": 1}}), 400, "gpu")
    # One bad field refuses the whole update, good fields included.
    assert_error(api.put(f"/v1/os-hosts/{host_id}", json={"vcpus": 8, "gpu": [1]}), 400, "gpu")
    assert_error(api.put(f"/v1/os-hosts/{host_id}", json={"hypervisor_hostname": "x"}), 400)
    assert_error(api.put(f"/v1/os-hosts/{host_id}", json={"name": "renamed"}), 400, "name")
    assert_error(api.get("/v1/os-hosts/allocations?start_date=yesterday"), 400, "start_date")
    assert_error(api.get("/v1/os-hosts/allocations?end_date=2031-02-30"), 400, "end_date")
    assert_error(api.get(f"/v1/os-hosts/{host_id}/allocation?start_date=x"), 400, "start_date")
    assert snapshot(live_sqlite, api) == before


def test_property_errors(api: httpx.Client) -> None:
    assert_error(api.patch("/v1/os-hosts/properties/gpu", json={"private": "yes"}), 400, "private")
    assert_error(api.patch("/v1/os-hosts/properties/gpu", json={"private": 1}), 400, "private")
    assert_error(api.patch("/v1/os-hosts/properties/gpu", json={"private": None}), 400, "private")
    assert_error(api.patch("/v1/os-hosts/properties/no_such", json={}), 404, "no_such")
    assert_error(api.patch("/v1/os-hosts/properties/gpu", content=b"[true]"), 400, "body")
    assert_error(
        api.patch("/v1/os-hosts/properties/no_such", json={"private": True}), 404, "no_such"
    )
    listed = api.get("/v1/os-hosts/properties?detail=True&all=True").json()
    assert listed == {
        "resource_properties": [{"property": "gpu", "private": False, "values": ["a100", "v100"]}]
    }


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/nothing", 404),
        ("GET", "/v2/leases", 404),
        ("POST", "/nothing", 404),
        ("GET", "/v1/leases/x/y", 404),
        ("DELETE", "/v1/leases", 405),
        ("PATCH", "/v1/leases", 405),
        ("POST", "/v1/leases/abc", 405),
        ("PATCH", "/v1/os-hosts/1", 405),
        ("POST", "/v1/os-hosts/properties", 405),
        ("DELETE", "/v1/os-hosts/properties/gpu", 405),
        ("PUT", "/", 405),
    ],
)
def test_unknown_route_and_wrong_method_get_json_errors(
    shared_api: httpx.Client, method: str, path: str, status: int
) -> None:
    response = shared_api.request(method, path, json={})
    assert_error(response, status)
    assert response.headers["OpenStack-API-Version"] == "reservation 1.0"
    assert response.json()["error"] == status  # Blazar's key for routing errors
    assert (
        response.json()["error_message"]
        == {
            404: "The requested URL was not found on the server. If you entered the URL manually "
            "please check your spelling and try again.",
            405: "The method is not allowed for the requested URL.",
        }[status]
    )


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("TRACE", "/v1/leases", {"GET", "POST"}),
        ("PATCH", "/v1/leases/abc", {"GET", "PUT", "DELETE"}),
        ("DELETE", "/v1/os-hosts/properties/gpu", {"PATCH"}),
        ("POST", "/versions", {"GET"}),
    ],
)
def test_wrong_method_names_the_allowed_ones(
    shared_api: httpx.Client, method: str, path: str, allowed: set[str]
) -> None:
    """RFC 9110: a 405 carries ``Allow`` (found by schemathesis: it was dropped with the body)."""
    response = shared_api.request(method, path)
    assert_error(response, 405)
    assert {m.strip() for m in response.headers["Allow"].split(",")} == allowed


# -- updates -------------------------------------------------------------------------------------


def test_update_that_does_not_fit_is_409_and_changes_nothing(live: LiveServer) -> None:
    t0 = soon(0)

    def day(days: float) -> str:
        return fmt(t0 + dt.timedelta(days=days))

    with client(live) as http:
        add_host(http, "compute-0")
        first = create_lease(http, lease_body("first", start_date=day(1), end_date=day(2)))
        create_lease(http, lease_body("second", start_date=day(3), end_date=day(4)))
        before = snapshot(live, http)
        path = f"/v1/leases/{first['id']}"
        refusals: list[dict[str, Any]] = [
            {"end_date": day(3.1)},
            {"name": "renamed", "end_date": day(3.1)},
            {"start_date": day(3.5), "end_date": day(5)},
            {
                "name": "renamed",
                "reservations": [{"id": first["reservations"][0]["id"], "min": 2, "max": 2}],
            },
        ]
        for changes in refusals:
            response = http.put(path, json=changes)
            body = assert_error(response, 409)
            assert body["error_name"] == 409
            assert set(body) >= REFUSAL_KEYS
            assert get_lease(http, first["id"]) == first
        assert snapshot(live, http) == before
        # What fits is accepted.
        response = http.put(path, json={"name": "renamed", "end_date": day(3)})
        assert response.status_code == 200, response.text
        assert response.json()["lease"]["name"] == "renamed"


@pytest.mark.parametrize(
    ("changes", "status", "field"),
    [
        pytest.param({"colour": "red"}, 400, "colour", id="unknown-field"),
        pytest.param({"events": [{"event_type": "x"}]}, 400, "events", id="events"),
        pytest.param({"name": 5}, 400, "name", id="name-number"),
        pytest.param({"name": ""}, 400, "name", id="name-empty"),
        pytest.param({"name": "n" * 81}, 400, "name", id="name-too-long"),
        pytest.param({"end_date": "whenever"}, 400, "end_date", id="end-not-a-date"),
        pytest.param({"end_date": "2001-01-01 00:00"}, 400, "end_date", id="end-before-start"),
        pytest.param({"start_date": "2001-01-01 00:00"}, 400, "start_date", id="start-past"),
        pytest.param({"before_end_date": "2001-01-01 00:00"}, 403, "before_end_date", id="be"),
        pytest.param({"reservations": "x"}, 400, "reservations", id="reservations-string"),
        pytest.param({"reservations": [3]}, 400, "reservations[0]", id="reservation-number"),
        pytest.param(
            {"reservations": [{"min": "abc"}]}, 400, "reservations[0].min", id="min-not-a-num"
        ),
        pytest.param(
            {"reservations": [{"min": 3, "max": 2}]}, 400, "reservations[0].max", id="min-gt-max"
        ),
        pytest.param(
            {"reservations": [{"id": "nope", "min": 1}]}, 400, "reservations[0].id", id="bad-id"
        ),
        pytest.param(
            {"reservations": [{"resource_type": "virtual:teleporter"}]},
            400,
            "reservations[0].resource_type",
            id="resource-type-changed",
        ),
        pytest.param(
            {"reservations": [{"resource_properties": '["~"]'}]},
            400,
            "resource_properties",
            id="bad-query",
        ),
    ],
)
def test_bad_update_is_refused_and_changes_nothing(
    shared: LiveServer, shared_api: httpx.Client, changes: dict[str, Any], status: int, field: str
) -> None:
    lease = create_lease(shared_api, lease_body(f"keep-{uuid.uuid4().hex[:8]}"))
    changes = copy.deepcopy(changes)
    for change in changes.get("reservations", []):
        if isinstance(
            change, dict
        ):  # each names its reservation (but the one that names a wrong one)
            change.setdefault("id", lease["reservations"][0]["id"])
    before = snapshot(shared, shared_api)
    assert_error(shared_api.put(f"/v1/leases/{lease['id']}", json=changes), status, field)
    assert get_lease(shared_api, lease["id"]) == lease
    assert snapshot(shared, shared_api) == before
    assert shared_api.delete(f"/v1/leases/{lease['id']}").status_code == 204


def test_bad_update_body_is_refused(api: httpx.Client) -> None:
    lease = create_lease(api, lease_body("keep"))
    path = f"/v1/leases/{lease['id']}"
    assert_error(api.put(path, content=b"[]"), 400, "body")
    assert_error(api.put(path, content=b"{oops"), 400, "body")
    assert get_lease(api, lease["id"]) == lease


def test_unknown_reservation_keys_are_ignored_and_not_stored_as_blazar_does(
    live_sqlite: LiveServer,
) -> None:
    """Blazar's plugins read only their fields (the blazar CLI and scripts may send more):
    the lease is made or changed as without them, and they are not stored. Bad values of the
    fields a type takes are still refused, and the state a reservation records
    (``started_at``) cannot be sent."""
    size = {"vcpus": 8, "memory_mb": 16384, "local_gb": 100}
    instance = {
        "resource_type": "virtual:instance",
        "amount": 1,
        "vcpus": 1,
        "memory_mb": 512,
        "disk_gb": 1,
        "affinity": None,
        "resource_properties": "",
    }
    extra = {"foo": "bar", "flavor": "m1.large", "started_at": "2030-01-01T00:00:00"}
    with client(live_sqlite) as http:
        for name in ("compute-0", "compute-1", "compute-2", "compute-3"):
            add_host(http, name, **size)
        body = lease_body("extra", reservations=[{**reservation(), **extra}, {**instance, **extra}])
        lease = create_lease(http, body)
        plain = create_lease(http, lease_body("plain", reservations=[reservation(), instance]))
        for shown, without in zip(lease["reservations"], plain["reservations"], strict=True):
            assert not set(extra) & {k for k, v in shown.items() if v is not None}
            assert set(shown) == set(without)
        path = f"/v1/leases/{lease['id']}"
        host_id, instance_id = (r["id"] for r in lease["reservations"])
        changes = {"reservations": [{"id": host_id, "foo": 1}, {"id": instance_id, "colour": 2}]}
        response = http.put(path, json=changes)
        assert response.status_code == 200, response.text

        def kept(found: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {k: v for k, v in r.items() if k != "updated_at"} for r in found["reservations"]
            ]

        assert kept(get_lease(http, lease["id"])) == kept(lease)
        response = http.put(
            path, json={"reservations": [{"id": instance_id, "foo": 1, "amount": 2}]}
        )
        assert response.status_code == 200, response.text
        [_, changed] = get_lease(http, lease["id"])["reservations"]
        assert changed["amount"] == 2 and "foo" not in changed
        bad = {**reservation(), "foo": "bar", "min": "abc"}
        assert_error(http.post("/v1/leases", json=lease_body("bad", reservations=[bad])), 400,
                     "reservations[0].min")  # fmt: skip


def test_an_empty_update_answers_the_lease_unchanged_as_blazar_does(api: httpx.Client) -> None:
    lease = create_lease(api, lease_body("keep"))
    path = f"/v1/leases/{lease['id']}"
    for empty in ({}, {"events": []}):
        response = api.put(path, json=empty)
        assert response.status_code == 200, response.text
        assert response.json()["lease"] == get_lease(api, lease["id"]) == lease
    assert api.put(path, content=b"").json()["lease"] == lease


def test_active_lease_start_cannot_move_but_its_end_can_within_capacity(
    live_sqlite: LiveServer, api: httpx.Client
) -> None:
    t0 = soon(0)

    def hour(hours: float) -> dt.datetime:
        return t0 + dt.timedelta(hours=hours)

    # Only one host matches, so the blocker below really blocks.
    only_a100 = '["==", "$gpu", "a100"]'
    body = lease_body(
        "running",
        start_date="now",
        end_date=fmt(hour(2)),
        reservations=[reservation(resource_properties=only_a100)],
    )
    lease = wait_for_status(api, create_lease(api, body)["id"], "ACTIVE")
    path = f"/v1/leases/{lease['id']}"

    before = snapshot(live_sqlite, api)
    for start in (fmt(hour(1)), "now"):
        assert_error(
            api.put(path, json={"start_date": start}),
            400,
            "start_date",
            "Cannot modify the start date of already started leases",
        )
    assert_error(api.put(path, json={"end_date": "2001-01-01 00:00"}), 400, "end_date")
    assert get_lease(api, lease["id"]) == lease
    assert snapshot(live_sqlite, api) == before

    response = api.put(path, json={"end_date": fmt(hour(3))})
    assert response.status_code == 200, response.text
    extended = response.json()["lease"]
    assert extended["status"] == "ACTIVE"
    assert extended["end_date"] == wire(hour(3))
    (allocation,) = extended["reservations"][0]["allocations"]
    assert allocation["end_date"] == wire(hour(3))

    blocker = lease_body(
        "blocker",
        start_date=fmt(hour(4)),
        end_date=fmt(hour(5)),
        reservations=[reservation(resource_properties=only_a100)],
    )
    create_lease(api, blocker)
    current = get_lease(api, lease["id"])
    before = snapshot(live_sqlite, api)
    response = api.put(path, json={"end_date": fmt(hour(6))})
    assert_error(response, 409)
    assert get_lease(api, lease["id"]) == current
    assert snapshot(live_sqlite, api) == before


def test_a_slashed_path_is_not_its_twin_as_in_blazar(api: httpx.Client) -> None:
    for method, path in (("GET", "/v1/leases/"), ("POST", "/v1/leases/"), ("GET", "/v1/os-hosts/")):
        assert_error(api.request(method, path, json={}), 404)
    page = api.get("/ui", follow_redirects=False)
    assert (page.status_code, page.headers["location"]) == (307, "/ui/")  # the page's own


def test_property_listing_flags_read_as_blazar_reads_them(api: httpx.Client) -> None:
    host_id = api.get("/v1/os-hosts").json()["hosts"][0]["id"]
    api.put(f"/v1/os-hosts/{host_id}", json={"rack": "r1"}).raise_for_status()
    for asked in ("True", "true", "1", "yes"):
        listed = api.get("/v1/os-hosts/properties", params={"detail": asked}).json()
        assert {"property": "rack", "private": False, "values": ["r1"]} in listed[
            "resource_properties"
        ], asked
    for plain in ("False", "0", "no"):
        listed = api.get("/v1/os-hosts/properties", params={"detail": plain}).json()
        assert {"property": "rack"} in listed["resource_properties"], plain
    host = api.get(f"/v1/os-hosts/{host_id}").json()["host"]
    assert host["availability_zone"] == ""  # Blazar's key, always there
