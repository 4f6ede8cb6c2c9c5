"""Webhook delivery from the outbox: signed, retried while the receiver is down, dead-lettered."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from climate.config import Settings
from climate.db import outbox
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.notify.delivery import SIGNATURE_HEADER, Deliverer
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

SECRET = "s3cret"


class Receiver:
    """A real HTTP server on loopback that answers with the statuses it is told to."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _setup(settings: Settings, db: Database, clock: ManualClock, urls: tuple[str, ...]):
    ctx = build_context(
        settings.model_copy(
            update={"webhooks": urls, "webhook_secret": SECRET, "webhook_max_attempts": 3}
        ),
        db,
        clock,
    )
    add_hosts(HostService(ctx), 1)
    return ctx, LeaseService(ctx), Deliverer(ctx)


def test_notification_is_delivered_signed_with_the_lease(
    settings: Settings, db: Database, clock: ManualClock, receiver: Receiver
) -> None:
    ctx, leases, deliverer = _setup(settings, db, clock, (receiver.url,))
    lease = leases.create(
        ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
    )
    assert deliverer.deliver_due() == 1
    ((headers, body),) = receiver.received
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == expected
    assert headers["X-Climate-Event"] == "lease.create"
    payload = json.loads(body)
    assert payload["event"] == "lease.create"
    assert payload["lease"]["id"] == lease.id
    assert payload["lease"]["project_id"] == "project-a"
    with db.reader() as session:
        assert [m.status for m in outbox.by_status(session, outbox.DELIVERED)] == ["delivered"]


def test_receiver_down_is_retried_with_backoff_until_it_answers(
    settings: Settings, db: Database, clock: ManualClock, receiver: Receiver
) -> None:
    ctx, leases, deliverer = _setup(settings, db, clock, (receiver.url,))
    receiver.statuses = [503]
    leases.create(ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)))
    assert deliverer.deliver_due() == 1
    with db.reader() as session:
        (pending,) = outbox.by_status(session, outbox.PENDING)
        assert (pending.attempts, pending.last_error) == (1, "HTTP 503")
    assert deliverer.deliver_due() == 0  # not before its backoff
    clock.advance(dt.timedelta(seconds=30))
    assert deliverer.deliver_due() == 1
    assert len(receiver.received) == 2
    with db.reader() as session:
        assert len(outbox.by_status(session, outbox.DELIVERED)) == 1


def test_unreachable_receiver_is_dead_lettered_and_others_still_get_theirs(
    settings: Settings, db: Database, clock: ManualClock, receiver: Receiver
) -> None:
    from tests.conftest import free_port

    nobody = f"http://127.0.0.1:{free_port()}/hook"
    ctx, leases, deliverer = _setup(settings, db, clock, (nobody, receiver.url))
    leases.create(ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)))
    for _ in range(3):
        deliverer.deliver_due()
        clock.advance(dt.timedelta(minutes=10))
    with db.reader() as session:
        (dead,) = outbox.by_status(session, outbox.DEAD)
        assert dead.url == nobody
        assert dead.attempts == 3
        assert "ConnectError" in (dead.last_error or "")
        assert len(outbox.by_status(session, outbox.DELIVERED)) == 1
    assert len(receiver.received) == 1
