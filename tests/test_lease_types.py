"""Lease types (immediate, retry, best effort), the waiting queue and holds, end to end: a live
server with the manager running, on the real clock, over SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from climate.config import Settings
from climate.db.tables import OutboxMessage
from tests.conftest import LiveServer, serve

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
FORMAT = "%Y-%m-%d %H:%M:%S"


@pytest.fixture
def server(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    fast = settings.model_copy(
        update={
            "retry_interval_seconds": 0.3,
            "queue_poll_seconds": 0.2,
            "webhooks": ("http://127.0.0.1:9/hook",),
            "webhook_max_attempts": 1,
        }
    )
    with serve(fast, database_url) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.post("/v1/os-hosts", json={"name": "c1"}).raise_for_status()
        yield client


def at(delta: dt.timedelta) -> str:
    return (dt.datetime.now(dt.UTC) + delta).strftime(FORMAT)


def lease_body(name: str, hours: float = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": "now",
        "end_date": at(dt.timedelta(hours=hours)),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                "hypervisor_properties": "",
                "resource_properties": "",
            }
        ],
        "events": [],
        **extra,
    }


def create(http: httpx.Client, body: dict[str, Any], status: int = 201, **kw: Any) -> Any:
    response = http.post("/v1/leases", json=body, **kw)
    assert response.status_code == status, response.text
    return response.json()


def lease_of(http: httpx.Client, lease_id: str) -> dict[str, Any]:
    found: dict[str, Any] = http.get(f"/v1/leases/{lease_id}").raise_for_status().json()["lease"]
    return found


def wait_for(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def status_becomes(http: httpx.Client, lease_id: str, status: str) -> dict[str, Any]:
    wait_for(lambda: lease_of(http, lease_id)["status"] == status)
    return lease_of(http, lease_id)


def topics(server: LiveServer, lease_id: str) -> list[str]:
    with server.ctx.db.reader() as session:
        query = select(OutboxMessage.topic).where(OutboxMessage.lease_id == lease_id)
        return list(session.scalars(query.order_by(OutboxMessage.id)))


def occupy(http: httpx.Client, name: str = "occupant") -> dict[str, Any]:
    """The only host, taken now by an immediate lease (ACTIVE when this returns)."""
    lease: dict[str, Any] = create(http, lease_body(name, lease_type="immediate"))["lease"]
    assert lease["status"] == "ACTIVE"
    return lease


# -- immediate ------------------------------------------------------------------------------


def test_immediate_lease_is_active_when_created(http: httpx.Client) -> None:
    lease = occupy(http)
    assert lease["lease_type"] == "immediate"
    assert [r["status"] for r in lease["reservations"]] == ["active"]
    assert lease["queue_position"] is None


def test_refused_immediate_lease_leaves_nothing_behind(
    http: httpx.Client, server: LiveServer
) -> None:
    occupant = occupy(http)
    refused = create(http, lease_body("late", lease_type="immediate"), 409)
    assert refused["error_name"] == 409 and "reason" in refused
    assert [lease["id"] for lease in http.get("/v1/leases").json()["leases"]] == [occupant["id"]]
    allocations = http.get("/v1/os-hosts/allocations").json()["allocations"]
    assert {r["lease_id"] for a in allocations for r in a["reservations"]} == {occupant["id"]}
    with server.ctx.db.reader() as session:
        assert set(session.scalars(select(OutboxMessage.lease_id))) == {occupant["id"]}


def test_immediate_lease_cannot_start_later(http: httpx.Client) -> None:
    body = lease_body("later", lease_type="immediate", start_date=at(dt.timedelta(hours=1)))
    refused = create(http, body, 400)
    assert "start_date" in refused["error_message"]


# -- retry ----------------------------------------------------------------------------------


def test_retry_lease_waits_then_starts_when_capacity_frees(
    http: httpx.Client, server: LiveServer
) -> None:
    occupant = occupy(http)
    waiting = create(http, lease_body("retry", lease_type="retry", retries=5))["lease"]
    assert waiting["status"] == "IN_PROGRESS"
    assert waiting["attempts"] == 1
    assert waiting["retries"] == 5
    assert waiting["status_reason"]
    assert waiting["events"] == []
    http.delete(f"/v1/leases/{occupant['id']}").raise_for_status()
    started = status_becomes(http, waiting["id"], "ACTIVE")
    assert started["attempts"] >= 2
    assert started["status_reason"] is None
    assert "lease.update" in topics(server, waiting["id"])


def test_retry_lease_fails_after_its_attempts(http: httpx.Client, server: LiveServer) -> None:
    occupy(http)
    waiting = create(http, lease_body("retry", lease_type="retry", retries=2))["lease"]
    failed = status_becomes(http, waiting["id"], "ERROR")
    assert failed["attempts"] == 2
    assert failed["status_reason"].startswith("refused 2 time(s)")
    assert failed["next_attempt_at"] is None
    assert topics(server, waiting["id"]) == ["lease.create", "lease.error"]


def test_retries_may_not_exceed_the_configured_cap(http: httpx.Client) -> None:
    refused = create(http, lease_body("greedy", lease_type="retry", retries=99), 400)
    assert "retries" in refused["error_message"]


# -- best effort and the queue ----------------------------------------------------------------


def test_best_effort_times_out_at_its_deadline(http: httpx.Client, server: LiveServer) -> None:
    occupy(http)
    body = lease_body("hunt", lease_type="best_effort", deadline=at(dt.timedelta(seconds=2)))
    waiting = create(http, body)["lease"]
    assert waiting["status"] == "IN_PROGRESS"
    assert waiting["deadline"] is not None
    timed_out = status_becomes(http, waiting["id"], "TIMEDOUT")
    assert "deadline" in timed_out["status_reason"]
    assert topics(server, waiting["id"])[-1] == "lease.error"


def test_best_effort_needs_a_future_deadline(http: httpx.Client) -> None:
    refused = create(http, lease_body("hunt", lease_type="best_effort"), 400)
    assert "deadline" in refused["error_message"]


def test_waiting_leases_are_served_by_priority_then_request_time(http: httpx.Client) -> None:
    occupant = occupy(http)
    deadline = at(dt.timedelta(minutes=5))

    def hunt(name: str, **extra: Any) -> str:
        body = lease_body(name, lease_type="best_effort", deadline=deadline, **extra)
        lease_id: str = create(http, body)["lease"]["id"]
        return lease_id

    first = hunt("first")
    second = hunt("second")
    urgent = hunt("urgent", priority=5)  # an admin may raise a priority
    hunt("humble", priority=-1)

    def queue() -> dict[str, int]:
        listed = http.get("/v1/leases", params={"status": "IN_PROGRESS"}).json()["leases"]
        return {lease["name"]: lease["queue_position"] for lease in listed}

    assert queue() == {"urgent": 1, "first": 2, "second": 3, "humble": 4}
    http.delete(f"/v1/leases/{occupant['id']}").raise_for_status()
    status_becomes(http, urgent, "ACTIVE")
    assert queue() == {"first": 1, "second": 2, "humble": 3}
    http.delete(f"/v1/leases/{urgent}").raise_for_status()
    status_becomes(http, first, "ACTIVE")
    assert queue() == {"second": 1, "humble": 2}
    assert lease_of(http, second)["queue_position"] == 1


def test_members_may_lower_their_priority_but_not_raise_it(http: httpx.Client) -> None:
    occupy(http)
    deadline = at(dt.timedelta(minutes=5))
    body = lease_body("mine", lease_type="best_effort", deadline=deadline)
    create(http, {**body, "priority": 1}, 403, headers=ALICE)
    lowered = create(http, {**body, "priority": -3}, headers=ALICE)["lease"]
    assert lowered["priority"] == -3


def test_a_lease_ending_early_admits_the_waiting_best_effort_lease(http: httpx.Client) -> None:
    occupant = occupy(http)
    body = lease_body("hunt", lease_type="best_effort", deadline=at(dt.timedelta(minutes=5)))
    waiting = create(http, body)["lease"]
    shrunk = {"end_date": at(dt.timedelta(seconds=2))}
    http.put(f"/v1/leases/{occupant['id']}", json=shrunk).raise_for_status()
    status_becomes(http, occupant["id"], "TERMINATED")
    started = status_becomes(http, waiting["id"], "ACTIVE")
    assert started["queue_position"] is None


def test_a_host_added_admits_the_waiting_best_effort_lease(http: httpx.Client) -> None:
    occupy(http)
    body = lease_body("hunt", lease_type="best_effort", deadline=at(dt.timedelta(minutes=5)))
    waiting = create(http, body)["lease"]
    http.post("/v1/os-hosts", json={"name": "c2"}).raise_for_status()
    status_becomes(http, waiting["id"], "ACTIVE")


# -- holds ------------------------------------------------------------------------------------


def held_body(name: str, expires_in: int) -> dict[str, Any]:
    return lease_body(
        name,
        start_date=at(dt.timedelta(hours=1)),
        end_date=at(dt.timedelta(hours=2)),
        hold={"expires_in": expires_in},
    )


def test_a_hold_keeps_its_resources_until_confirmed(http: httpx.Client) -> None:
    held = create(http, held_body("held", 600))["lease"]
    assert held["status"] == "HELD"
    assert held["events"] == []
    assert held["hold_expires_at"] is not None
    create(http, {**held_body("rival", 600), "hold": None}, 409)  # the host is taken
    confirmed = http.post(f"/v1/leases/{held['id']}/confirm").raise_for_status().json()["lease"]
    assert confirmed["status"] == "PENDING"
    assert confirmed["hold_expires_at"] is None
    kinds = sorted(e["event_type"] for e in confirmed["events"])
    assert kinds == ["before_end_lease", "end_lease", "start_lease"]
    again = http.post(f"/v1/leases/{held['id']}/confirm")
    assert again.status_code == 409


def test_an_unconfirmed_hold_lapses_and_frees_its_resources(
    http: httpx.Client, server: LiveServer
) -> None:
    held = create(http, held_body("held", 1))["lease"]
    lapsed = status_becomes(http, held["id"], "EXPIRED")
    assert "not confirmed" in lapsed["status_reason"]
    assert [r["status"] for r in lapsed["reservations"]] == ["deleted"]
    assert http.post(f"/v1/leases/{held['id']}/confirm").status_code == 409
    create(http, {**held_body("next", 600), "hold": None})  # the host is free again
    assert topics(server, held["id"]) == ["lease.create", "lease.update"]


def test_another_project_may_not_confirm_a_hold(http: httpx.Client) -> None:
    held = create(http, held_body("held", 600))["lease"]
    assert http.post(f"/v1/leases/{held['id']}/confirm", headers=ALICE).status_code == 404


@pytest.mark.parametrize(
    ("hold", "field"),
    [
        ({"hold": {"expires_in": 0}}, "hold.expires_in"),
        ({"hold": {"expires_in": 86401}}, "hold.expires_in"),
        ({"hold_minutes": 0}, "hold_minutes"),
        ({"hold_minutes": 1441}, "hold_minutes"),
    ],
)
def test_a_hold_too_short_or_too_long_is_refused_naming_the_field_given(
    http: httpx.Client, hold: dict[str, Any], field: str
) -> None:
    body = {**held_body("held", 600), "hold": None, **hold}
    refused = create(http, {k: v for k, v in body.items() if v is not None}, 400)
    assert refused["error_message"] == (
        f"{field}: a hold lasts from 1 second to 86400 seconds (1440 minutes)"
    )


def test_a_hold_needs_a_future_start(http: httpx.Client) -> None:
    refused = create(http, lease_body("now", hold={"expires_in": 60}), 400)
    assert "hold" in refused["error_message"]
