"""The database failing under a request, for real: a PostgreSQL backend terminated while it
serves one. The request gets a 503 saying the database is unavailable (not a 500, not a hang),
nothing half-made is left, and the next requests are served as usual."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Collection, Iterator

import httpx
import psycopg
import pytest

from climate.config import Settings
from tests.conftest import LiveServer, _reset_pg, serve
from tests.test_api_errors import assert_error, client
from tests.test_notifications import Receiver


@pytest.fixture
def live_pg(settings: Settings, pg_url: str) -> Iterator[tuple[LiveServer, str]]:
    _reset_pg(pg_url)
    with serve(settings, pg_url) as server:
        yield server, pg_url


def _lease(name: str, days: int) -> dict[str, object]:
    start = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    return {
        "name": name,
        "start_date": start.strftime("%Y-%m-%d %H:%M"),
        "end_date": (start + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
    }


def _terminate_the_waiting_backend(
    admin: psycopg.Connection, database: str, besides: Collection[int] = ()
) -> int:
    """The pid of the server's backend that waits on the test's lock, once terminated."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
            " AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
        if row is not None and row[0] not in besides:
            admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            return int(row[0])
        time.sleep(0.02)
    raise AssertionError("no backend of the server waited on the lock")


def test_a_backend_terminated_mid_request_is_a_503_and_the_next_requests_are_served(
    live_pg: tuple[LiveServer, str],
) -> None:
    server, url = live_pg
    database = url.rsplit("/", 1)[1]
    with client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as admin:
            # The server's insert of the lease waits on this lock, inside its transaction.
            locker.execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            answers: list[httpx.Response] = []
            sending = threading.Thread(
                target=lambda: answers.append(http.post("/v1/leases", json=_lease("cut", 1)))
            )
            began = time.monotonic()
            sending.start()
            _terminate_the_waiting_backend(admin, database)
            locker.rollback()
            sending.join(20)
        assert answers, "the request hung"
        assert time.monotonic() - began < 10
        (cut,) = answers
        assert_error(cut, 503, "database unavailable")
        assert cut.headers["retry-after"] == "1"
        listed = http.get("/v1/leases")
        assert listed.status_code == 200
        assert [lease["name"] for lease in listed.json()["leases"]] == []
        created = http.post("/v1/leases", json=_lease("after", 2))
        assert created.status_code == 201, created.text
        assert http.get("/v1/leases").json()["leases"][0]["name"] == "after"


def test_a_manager_whose_connection_is_cut_while_it_starts_a_lease_starts_it_at_the_next_pass(
    live_pg: tuple[LiveServer, str],
) -> None:
    """The manager's backend terminated while it starts a lease (waiting, inside the start's
    transaction, on a lock on the standalone backend's assignments): the pass fails and the
    start event stayed claimed by this live manager, which nobody takes over, for
    ``event_claim_seconds`` (120 s): the lease stayed PENDING two minutes past its start."""
    server, url = live_pg
    database = url.rsplit("/", 1)[1]
    with client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        now = dt.datetime.now(dt.UTC)
        body = {
            "name": "soon",
            "start_date": (now + dt.timedelta(seconds=2)).strftime("%Y-%m-%d %H:%M:%S"),
            "end_date": (now + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S"),
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        }
        created = http.post("/v1/leases", json=body)
        assert created.status_code == 201, created.text
        path = f"/v1/leases/{created.json()['lease']['id']}"
        with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as admin:
            locker.execute("LOCK TABLE assignments IN ACCESS EXCLUSIVE MODE")
            # The planned start (one transaction: claim and work), then, a second later, the
            # claimed one (the claim committed first, the work waiting on the lock).
            first = _terminate_the_waiting_backend(admin, database)
            second = _terminate_the_waiting_backend(admin, database, besides={first})
            assert first != second
            locker.rollback()
        cut = time.monotonic()
        status = ""
        while time.monotonic() < cut + 10:
            status = http.get(path).json()["lease"]["status"]
            if status == "ACTIVE":
                break
            time.sleep(0.1)
        assert status == "ACTIVE", status
        assert time.monotonic() - cut < 5


def test_a_deliverer_whose_connection_is_cut_while_it_records_a_send_sends_it_again_at_once(
    settings: Settings, pg_url: str
) -> None:
    """The deliverer's backend terminated while it records a webhook's answer (waiting on a
    lock on the message's row): the job failed and its claim was left to run out (here 35 s:
    3 x the 10 s timeout + 5 s), the message unsent meanwhile. It is handed back at the next
    pass and sent again (a repeat, as at-least-once allows) within seconds."""
    _reset_pg(pg_url)
    database = pg_url.rsplit("/", 1)[1]
    receiver = Receiver(hold=1.0)
    hooks = settings.model_copy(
        update={"webhooks": (receiver.url,), "webhook_timeout_seconds": 10.0}
    )
    try:
        with serve(hooks, pg_url) as server, client(server) as http:
            assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
            assert http.post("/v1/leases", json=_lease("l1", 1)).status_code == 201
            deadline = time.monotonic() + 10
            while not receiver.arrivals and time.monotonic() < deadline:
                time.sleep(0.02)
            assert receiver.arrivals, "the message was not sent"
            with (
                psycopg.connect(pg_url) as locker,
                psycopg.connect(pg_url, autocommit=True) as admin,
            ):
                locker.execute("SELECT id FROM outbox FOR UPDATE")
                _terminate_the_waiting_backend(admin, database)
                locker.rollback()
            cut = time.monotonic()
            while len(receiver.received) < 2 and time.monotonic() < cut + 10:
                time.sleep(0.05)
            assert len(receiver.received) == 2, "not sent again"
            assert time.monotonic() - cut < 6
            (first, _), (again, _) = receiver.received
            assert first["X-Climate-Delivery"] == again["X-Climate-Delivery"]
    finally:
        receiver.close()
