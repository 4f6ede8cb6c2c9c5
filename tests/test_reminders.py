"""A lease's before-end offset and reminders, end to end: a live server with the manager
running on the real clock, over SQLite and PostgreSQL. Notifications are read from the outbox.
Reminders of leases without events yet (waiting, held) are stored and made when admitted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import inspect, select

from climate.config import Settings
from climate.db import migrate
from climate.db.engine import Database
from climate.db.tables import Lease, OutboxMessage
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE as ALICE_ACTOR
from tests.conftest import T0, LiveServer, serve
from tests.helpers import add_hosts, host_request

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
WIRE = "%Y-%m-%dT%H:%M:%S.%f"


@pytest.fixture
def server(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    hooked = settings.model_copy(
        update={
            "webhooks": ("http://127.0.0.1:9/hook",),
            "webhook_max_attempts": 1,
            # Five tries last 5 s: a busy machine must not spend them all before the host frees.
            "retry_interval_seconds": 1.0,
            "queue_poll_seconds": 0.2,
        }
    )
    with serve(hooked, database_url) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30, headers=ALICE) as client:
        admin = {"X-Project-Id": "admin-project", "X-User-Id": "admin", "X-Roles": "admin"}
        client.post("/v1/os-hosts", json={"name": "c1"}, headers=admin).raise_for_status()
        yield client


def iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat()


def later(**delta: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(**delta)


def body(name: str, end: dt.datetime, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": "now",
        "end_date": iso(end),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                "hypervisor_properties": "",
                "resource_properties": "",
            }
        ],
        **extra,
    }


def create(http: httpx.Client, payload: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/leases", json=payload)
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error_message"].startswith(f"{field}: "), response.text


def when(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, WIRE).replace(tzinfo=dt.UTC)


def before_end_events(lease: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in lease["events"] if e["event_type"] == "before_end_lease"),
        key=lambda e: str(e["time"]),
    )


def notified(server: LiveServer, lease_id: str, topic: str) -> list[OutboxMessage]:
    with server.ctx.db.reader() as session:
        query = select(OutboxMessage).where(
            OutboxMessage.lease_id == lease_id, OutboxMessage.topic == topic
        )
        return list(session.scalars(query.order_by(OutboxMessage.id)))


def wait_for(http: httpx.Client, lease_id: str, status: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while http.get(f"/v1/leases/{lease_id}").json()["lease"]["status"] != status:
        assert time.monotonic() < deadline, f"lease {lease_id} never became {status}"
        time.sleep(0.1)


def test_reminders_fire_in_order_and_notify_then_the_lease_ends(
    server: LiveServer, http: httpx.Client
) -> None:
    end = later(seconds=7)
    lease = create(
        http, body("reminded", end, before_end_offset="PT5S", reminders=["PT2S", "PT4S"])
    )
    assert lease["reminders"] == ["PT4S", "PT2S"]
    assert when(lease["end_date"]) - when(lease["before_end_date"]) == dt.timedelta(seconds=5)
    times = [when(e["time"]) for e in before_end_events(lease)]
    assert [when(lease["end_date"]) - t for t in times] == [
        dt.timedelta(seconds=s) for s in (5, 4, 2)
    ]
    wait_for(http, lease["id"], "TERMINATED")
    messages = notified(server, lease["id"], "lease.before_end")
    assert len(messages) == 3
    sent = [m.created_at for m in messages]
    assert sent == sorted(sent)
    for message, due in zip(messages, times, strict=True):
        assert (
            due - dt.timedelta(seconds=0.5) <= message.created_at <= due + dt.timedelta(seconds=5)
        )
    shown = http.get(f"/v1/leases/{lease['id']}").json()["lease"]
    assert [e["status"] for e in before_end_events(shown)] == ["DONE"] * 3


def test_reminders_move_with_the_end_and_keep_their_offsets(http: httpx.Client) -> None:
    start = later(days=1).replace(microsecond=0)
    lease = create(
        http,
        {
            **body("moving", start + dt.timedelta(hours=4), reminders=["PT2H", "PT10M"]),
            "start_date": iso(start),
        },
    )
    new_end = start + dt.timedelta(hours=6)
    response = http.put(f"/v1/leases/{lease['id']}", json={"end_date": iso(new_end)})
    assert response.status_code == 200, response.text
    moved = response.json()["lease"]
    assert moved["reminders"] == ["PT2H", "PT10M"]
    # The before-end action keeps its own distance (the default hour) from the end.
    assert when(moved["before_end_date"]) == new_end - dt.timedelta(hours=1)
    events = before_end_events(moved)
    assert [when(e["time"]) for e in events] == [
        new_end - dt.timedelta(hours=2),
        new_end - dt.timedelta(hours=1),
        new_end - dt.timedelta(minutes=10),
    ]
    assert all(e["status"] == "UNDONE" for e in events)


def test_update_replaces_reminders_and_offset(http: httpx.Client) -> None:
    start = later(days=1).replace(microsecond=0)
    end = start + dt.timedelta(hours=4)
    lease = create(
        http, {**body("replaced", end, reminders=["PT2H", "PT10M"]), "start_date": iso(start)}
    )
    response = http.put(
        f"/v1/leases/{lease['id']}",
        json={"reminders": ["PT30M"], "before_end_offset": "01:30"},
    )
    assert response.status_code == 200, response.text
    changed = response.json()["lease"]
    assert changed["reminders"] == ["PT30M"]
    assert when(changed["before_end_date"]) == end - dt.timedelta(hours=1, minutes=30)
    assert sorted(when(e["time"]) for e in before_end_events(changed)) == [
        end - dt.timedelta(hours=1, minutes=30),
        end - dt.timedelta(minutes=30),
    ]
    cleared = http.put(f"/v1/leases/{lease['id']}", json={"reminders": []}).json()["lease"]
    assert cleared["reminders"] == []
    assert len(before_end_events(cleared)) == 1


def test_a_reminder_passed_by_a_shrink_is_skipped_and_comes_back_on_extension(
    http: httpx.Client,
) -> None:
    lease = create(http, body("shrunk", later(hours=2), reminders=["PT90M"]))
    wait_for(http, lease["id"], "ACTIVE")
    shrunk = http.put(f"/v1/leases/{lease['id']}", json={"end_date": iso(later(minutes=30))})
    assert shrunk.status_code == 200, shrunk.text
    shown = shrunk.json()["lease"]
    assert shown["reminders"] == ["PT1H30M"]
    [skipped] = [
        e for e in before_end_events(shown) if e["attempts"] == 0 and e["status"] == "DONE"
    ]
    assert when(skipped["time"]) < dt.datetime.now(dt.UTC)
    new_end = later(hours=3)
    extended = http.put(f"/v1/leases/{lease['id']}", json={"end_date": iso(new_end)})
    shown = extended.json()["lease"]
    assert shown["reminders"] == ["PT1H30M"]
    rearmed = [e for e in before_end_events(shown) if e["status"] == "UNDONE"]
    assert new_end - dt.timedelta(minutes=90) in [when(e["time"]) for e in rearmed]


def test_a_reminder_that_fired_fires_again_before_a_later_end(
    server: LiveServer, http: httpx.Client
) -> None:
    lease = create(http, body("again", later(seconds=8), reminders=["PT7S"]))
    deadline = time.monotonic() + 10
    while len(notified(server, lease["id"], "lease.before_end")) < 2:  # the action, the reminder
        assert time.monotonic() < deadline, "the reminder never fired"
        time.sleep(0.1)
    response = http.put(f"/v1/leases/{lease['id']}", json={"end_date": iso(later(seconds=10))})
    assert response.status_code == 200, response.text
    assert response.json()["lease"]["reminders"] == ["PT7S"]
    wait_for(http, lease["id"], "TERMINATED")
    shown = http.get(f"/v1/leases/{lease['id']}").json()["lease"]
    ran = [e for e in before_end_events(shown) if e["attempts"] > 0]
    # The action's event at the start, then the reminder before each end.
    assert len(ran) >= 3 and all(e["status"] == "DONE" for e in ran)
    assert len(notified(server, lease["id"], "lease.before_end")) == len(ran)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"reminders": "PT1H"}, "reminders"),
        ({"reminders": ["PT1H", "soon"]}, "reminders[1]"),
        ({"reminders": ["-60"]}, "reminders[0]"),
        ({"reminders": ["PT0S"]}, "reminders[0]"),
        ({"reminders": ["PT5H"]}, "reminders[0]"),
        ({"reminders": ["PT2H", "PT120M"]}, "reminders[1]"),
        ({"reminders": [f"PT{m}M" for m in range(1, 12)]}, "reminders"),
        ({"reminders": ["PT2H"], "before_end_offset": "PT2H"}, "reminders[0]"),
        ({"before_end_offset": "PT5H"}, "before_end_offset"),
        ({"before_end_offset": "later"}, "before_end_offset"),
        ({"before_end_offset": "PT1H", "before_end_date": "2031-01-01 10:00"}, "before_end_offset"),
    ],
)
def test_bad_reminders_are_refused_naming_the_field(
    http: httpx.Client, extra: dict[str, Any], field: str
) -> None:
    start = later(days=1)
    payload = {**body("bad", start + dt.timedelta(hours=4), **extra), "start_date": iso(start)}
    refused(http.post("/v1/leases", json=payload), field)
    assert http.get("/v1/leases").json()["leases"] == []


def test_bad_reminder_updates_are_refused_naming_the_field(http: httpx.Client) -> None:
    start = later(days=1).replace(microsecond=0)
    lease = create(
        http,
        {
            **body("kept", start + dt.timedelta(hours=4), reminders=["PT3H"]),
            "start_date": iso(start),
        },
    )
    url = f"/v1/leases/{lease['id']}"
    refused(http.put(url, json={"reminders": ["PT2H", "PT2H"]}), "reminders[1]")
    refused(http.put(url, json={"reminders": ["PT9H"]}), "reminders[0]")
    # Shrinking a lease that has not started below a reminder it keeps: change both at once.
    refused(http.put(url, json={"end_date": iso(start + dt.timedelta(hours=2))}), "reminders")
    response = http.put(
        url, json={"end_date": iso(start + dt.timedelta(hours=2)), "reminders": ["PT1H30M"]}
    )
    assert response.status_code == 200, response.text
    assert response.json()["lease"]["reminders"] == ["PT1H30M"]


def test_a_refused_leases_offers_keep_its_reminders(http: httpx.Client) -> None:
    start = later(days=1).replace(microsecond=0)
    window = {"start_date": iso(start)}
    create(http, {**body("first", start + dt.timedelta(hours=4)), **window})
    wanted = {
        **body("second", start + dt.timedelta(hours=4), reminders=["PT10M"]),
        **window,
        "before_end_offset": "PT30M",
    }
    response = http.post("/v1/leases", json=wanted)
    assert response.status_code == 409, response.text
    [later_start] = [o for o in response.json()["offers"] if o["kind"] == "later_start"]
    offered = later_start["lease"]
    assert (offered["reminders"], offered["before_end_offset"]) == (["PT10M"], "PT30M")
    accepted = create(http, offered)
    assert accepted["reminders"] == ["PT10M"]
    assert when(accepted["end_date"]) - when(accepted["before_end_date"]) == dt.timedelta(
        minutes=30
    )


# -- leases without events yet: waiting (retry, best effort) and held -----------------------


def occupy(http: httpx.Client) -> dict[str, Any]:
    """The only host, taken now until it is deleted."""
    occupant = create(http, body("occupant", later(hours=1), lease_type="immediate"))
    assert occupant["status"] == "ACTIVE"
    return occupant


def test_a_waiting_retry_lease_gets_its_reminders_when_admitted(http: httpx.Client) -> None:
    occupant = occupy(http)
    waiting = create(
        http,
        body(
            "retry",
            later(hours=2),
            lease_type="retry",
            retries=5,
            before_end_offset="PT20M",
            reminders=["PT10M", "PT30M"],
        ),
    )
    assert (waiting["status"], waiting["events"]) == ("IN_PROGRESS", [])
    assert waiting["reminders"] == ["PT30M", "PT10M"]
    shown = http.get(f"/v1/leases/{waiting['id']}").json()["lease"]
    assert (shown["reminders"], shown["events"]) == (["PT30M", "PT10M"], [])
    length = when(waiting["end_date"]) - when(waiting["start_date"])
    time.sleep(1)  # admitted a second later at least: every date shifts by that much
    http.delete(f"/v1/leases/{occupant['id']}").raise_for_status()
    wait_for(http, waiting["id"], "ACTIVE")
    admitted = http.get(f"/v1/leases/{waiting['id']}").json()["lease"]
    end = when(admitted["end_date"])
    assert end - when(admitted["start_date"]) == length
    assert end - when(waiting["end_date"]) >= dt.timedelta(seconds=1)
    assert admitted["reminders"] == ["PT30M", "PT10M"]
    assert end - when(admitted["before_end_date"]) == dt.timedelta(minutes=20)
    events = before_end_events(admitted)
    assert [end - when(e["time"]) for e in events] == [
        dt.timedelta(minutes=m) for m in (30, 20, 10)
    ]
    assert all(e["status"] == "UNDONE" for e in events)


def test_a_best_effort_leases_reminder_fires_once_it_is_admitted(
    server: LiveServer, http: httpx.Client
) -> None:
    occupant = occupy(http)
    waiting = create(
        http,
        body(
            "hunt",
            later(seconds=6),
            lease_type="best_effort",
            deadline=iso(later(minutes=5)),
            reminders=["PT4S"],
        ),
    )
    assert (waiting["status"], waiting["events"], waiting["reminders"]) == (
        "IN_PROGRESS",
        [],
        ["PT4S"],
    )
    http.delete(f"/v1/leases/{occupant['id']}").raise_for_status()
    wait_for(http, waiting["id"], "TERMINATED")
    ended = http.get(f"/v1/leases/{waiting['id']}").json()["lease"]
    assert ended["reminders"] == ["PT4S"]
    # The action at the start of a lease shorter than the default hour, then the reminder.
    action, reminder = before_end_events(ended)
    assert when(action["time"]) == when(ended["start_date"])
    assert when(ended["end_date"]) - when(reminder["time"]) == dt.timedelta(seconds=4)
    assert reminder["status"] == "DONE" and reminder["attempts"] > 0
    assert len(notified(server, waiting["id"], "lease.before_end")) == 2


def test_a_hold_gets_its_reminders_when_confirmed(http: httpx.Client) -> None:
    start = later(hours=1).replace(microsecond=0)
    end = start + dt.timedelta(hours=3)
    held = create(
        http,
        {
            **body("held", end, reminders=["PT10M", "PT2H"], hold={"expires_in": 600}),
            "start_date": iso(start),
        },
    )
    assert (held["status"], held["events"], held["reminders"]) == ("HELD", [], ["PT2H", "PT10M"])
    confirmed = http.post(f"/v1/leases/{held['id']}/confirm")
    assert confirmed.status_code == 200, confirmed.text
    lease = confirmed.json()["lease"]
    assert lease["reminders"] == ["PT2H", "PT10M"]
    events = before_end_events(lease)
    assert [when(e["time"]) for e in events] == [
        end - dt.timedelta(hours=2),
        end - dt.timedelta(hours=1),  # the before-end action, by default
        end - dt.timedelta(minutes=10),
    ]
    assert all(e["status"] == "UNDONE" for e in events)
    replaced = http.put(f"/v1/leases/{held['id']}", json={"reminders": ["PT30M"]}).json()["lease"]
    assert replaced["reminders"] == ["PT30M"]
    assert [when(e["time"]) for e in before_end_events(replaced)] == [
        end - dt.timedelta(hours=1),
        end - dt.timedelta(minutes=30),
    ]
    cleared = http.put(f"/v1/leases/{held['id']}", json={"reminders": []}).json()["lease"]
    assert cleared["reminders"] == []
    assert len(before_end_events(cleared)) == 1


def test_a_bad_reminder_of_a_waiting_lease_is_refused(http: httpx.Client) -> None:
    occupy(http)
    payload = body("retry", later(hours=1), lease_type="retry", reminders=["PT2H"])
    refused(http.post("/v1/leases", json=payload), "reminders[0]")


def test_the_migration_stores_older_leases_reminders_from_their_events(
    db: Database, hosts: HostService, leases: LeaseService
) -> None:
    """Before revision 0010 a reminder's offset was only its event's distance from the end."""
    add_hosts(hosts, 1)
    hour = dt.timedelta(hours=1)
    request = dataclasses.replace(
        host_request("older", T0 + hour, T0 + 4 * hour), reminders=[hour / 6, 2 * hour]
    )
    reminded = leases.create(ALICE_ACTOR, request)
    plain = leases.create(ALICE_ACTOR, host_request("plain", T0 + 5 * hour, T0 + 6 * hour))
    config = migrate._config(db)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0009")
        assert "reminders" not in {c["name"] for c in inspect(connection).get_columns("leases")}
    migrate.upgrade(db)
    with db.reader() as session:
        assert session.get(Lease, reminded.id).reminders == [7200, 600]  # type: ignore[union-attr]
        assert session.get(Lease, plain.id).reminders is None  # type: ignore[union-attr]
    assert leases.get(ALICE_ACTOR, reminded.id).reminders == [7200, 600]
