"""Webhook delivery from the outbox: signed, retried while the receiver is down, dead-lettered."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, select

from climate.config import Settings, load_settings
from climate.db import outbox
from climate.db.engine import Database
from climate.db.tables import OutboxMessage
from climate.domain.clock import ManualClock, SystemClock
from climate.errors import InvalidInput
from climate.notify.delivery import Deliverer
from climate.notify.sinks import DELIVERY_HEADER, SIGNATURE_HEADER
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0, _reset_pg, free_port, serve
from tests.helpers import add_hosts, host_request
from tests.processes import CLIMATE, Process
from tests.receiver_process import ReceiverProcess

SECRET = "s3cret"


class Receiver:
    """A real HTTP server on loopback that answers with the statuses it is told to; a slow one
    (``hold``) keeps every request waiting that long (or until it is closed) before answering."""

    def __init__(self, hold: float = 0.0) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.arrivals: list[tuple[float, dict[str, str], bytes]] = []
        """(time.monotonic() at arrival, headers, body) of every request."""
        self.statuses: list[int] = []
        self.closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrivals.append((time.monotonic(), dict(self.headers), body))
                if hold:
                    receiver.closing.wait(hold)
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
        self.closing.set()
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


MALFORMED = "http://[::1:1243/hook"
"""The probe's URL: a bracket left open, so its "port" is ':1:1243'."""


@pytest.mark.parametrize(
    "bad",
    [
        MALFORMED,
        "ftp://127.0.0.1/hook",
        "http:///hook",
        "127.0.0.1:1242/hook",
        "http://127.0.0.1:99999/hook",
        "http://exa mple/hook",
    ],
)
def test_a_malformed_webhook_url_is_refused_at_start_up_naming_the_setting_and_the_url(
    bad: str,
) -> None:
    good = "http://127.0.0.1:1242/hook"
    with pytest.raises(InvalidInput) as refused:
        load_settings(env={"CLIMATE_WEBHOOKS": f"{bad},{good}"})
    assert refused.value.field == "CLIMATE_WEBHOOKS"
    assert repr(bad) in refused.value.message
    assert good not in refused.value.message
    assert load_settings(env={"CLIMATE_WEBHOOKS": f"{good},https://[::1]:8443/h"}).webhooks == (
        good,
        "https://[::1]:8443/h",
    )


@pytest.mark.slow
def test_climate_manager_does_not_start_with_a_malformed_webhook_url(sqlite_url: str) -> None:
    env = {**os.environ, "CLIMATE_WEBHOOKS": f"{MALFORMED},http://127.0.0.1:1242/hook"}
    done = subprocess.run(
        [CLIMATE, "manager", "--database-url", sqlite_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "error: CLIMATE_WEBHOOKS: not a webhook URL" in done.stderr
    assert MALFORMED in done.stderr


def test_a_stored_message_to_a_malformed_url_fails_alone_until_it_is_dead_lettered(
    settings: Settings, db: Database, clock: ManualClock, receiver: Receiver
) -> None:
    ctx, leases, deliverer = _setup(settings, db, clock, (receiver.url,))
    with db.transaction() as session:  # stored before webhook URLs were checked at start-up
        outbox.enqueue(session, [MALFORMED], "lease.create", {"event": "lease.create"}, T0)
    leases.create(ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)))
    assert deliverer.deliver_due() == 2
    assert len(receiver.received) == 1
    with db.reader() as session:
        (delivered,) = outbox.by_status(session, outbox.DELIVERED)
        assert delivered.url == receiver.url
        (failed,) = outbox.by_status(session, outbox.PENDING)
        assert (failed.url, failed.attempts) == (MALFORMED, 1)
        assert failed.last_error == "not a webhook URL: Invalid port: ':1:1243'"
        assert failed.next_attempt_at == T0 + dt.timedelta(seconds=1)
    for _ in range(2):
        clock.advance(dt.timedelta(minutes=10))
        assert deliverer.deliver_due() == 1
    with db.reader() as session:
        (dead,) = outbox.by_status(session, outbox.DEAD)
        assert (dead.url, dead.attempts) == (MALFORMED, 3)
    assert len(receiver.received) == 1


def _create_leases(api: str, count: int) -> dict[str, float]:
    """``count`` leases in one hour windows from an hour on, by HTTP; the time.monotonic() at
    which each was created (its response came back), by lease id."""
    assert httpx.post(f"{api}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    first = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    created = {}
    for i in range(count):
        start = first + dt.timedelta(hours=i)
        body = {
            "name": f"l{i}",
            "start_date": start.strftime("%Y-%m-%d %H:%M"),
            "end_date": (start + dt.timedelta(minutes=30)).strftime("%Y-%m-%d %H:%M"),
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
            "events": [],
        }
        response = httpx.post(f"{api}/v1/leases", json=body)
        assert response.status_code == 201, response.text
        created[response.json()["lease"]["id"]] = time.monotonic()
    return created


def _lags(
    receiver: Receiver | ReceiverProcess, created: dict[str, float], deadline: float
) -> list[float]:
    """Once ``receiver`` has a message for every lease (or at ``deadline``): how long after its
    lease's creation each message arrived, in arrival order."""
    while len(receiver.arrivals) < len(created) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [at - created[json.loads(body)["lease"]["id"]] for at, _, body in receiver.arrivals]


def test_a_slow_receiver_does_not_delay_the_others(settings: Settings, database_url: str) -> None:
    slow, healthy = Receiver(hold=30), ReceiverProcess()
    hooks = settings.model_copy(
        update={"webhooks": (slow.url, healthy.url), "webhook_timeout_seconds": 1.0}
    )
    try:
        with serve(hooks, database_url) as server:
            created = _create_leases(server.url, 20)
            lags = _lags(healthy, created, deadline=time.monotonic() + 30)
    finally:
        slow.close()
        healthy.close()
    assert len(lags) == 20
    assert max(lags) < 1.0, lags


@pytest.mark.slow
def test_every_healthy_receiver_gets_each_message_once_within_a_second_whatever_the_others(
    settings: Settings, pg_url: str
) -> None:
    """The probe's set-up on PostgreSQL with two managers, this process's and a ``climate
    manager``: one sink malformed (messages stored before start-up checks), one down, one slow,
    two healthy."""
    _reset_pg(pg_url)
    with Database(pg_url).transaction() as session:
        outbox.enqueue(
            session,
            [MALFORMED] * 5,
            "lease.create",
            {"event": "lease.create"},
            dt.datetime.now(dt.UTC),
        )
    slow, healthy, other = Receiver(hold=30), ReceiverProcess(), ReceiverProcess()
    down = f"http://127.0.0.1:{free_port()}/hook"
    hooks = (down, slow.url, healthy.url, other.url)
    second = Process(
        ["manager", "--database-url", pg_url],
        env={
            "CLIMATE_WEBHOOKS": ",".join(hooks),
            "CLIMATE_WEBHOOK_TIMEOUT_SECONDS": "1",
            "CLIMATE_WEBHOOK_MAX_ATTEMPTS": "3",
        },
    )
    db = Database(pg_url)
    try:
        _wait_for_output(second, "climate manager running")
        mine = settings.model_copy(
            update={"webhooks": hooks, "webhook_timeout_seconds": 1.0, "webhook_max_attempts": 3}
        )
        with serve(mine, pg_url) as server:
            created = _create_leases(server.url, 20)
            deadline = time.monotonic() + 30
            lags = {r.url: _lags(r, created, deadline) for r in (healthy, other)}
            # The down sink's last message dies 3 s after it was written (backoff 1 s, 2 s), past
            # the hold the claims used to have (timeout * 2 + 1 s): repeats would be in by then.
            _wait_until_dead(db, {MALFORMED: 5, down: 20}, deadline)
            for sink in (healthy, other):
                got = [
                    (h[DELIVERY_HEADER], json.loads(b)["lease"]["id"]) for _, h, b in sink.arrivals
                ]
                assert sorted(i for _, i in got) == sorted(created), (sink.url, got)
                assert max(lags[sink.url]) < 1.0, _late(db, sink, created, second)
    finally:
        slow.close()
        healthy.close()
        other.close()
        logs = second.stop()
        db.dispose()
    assert "Traceback" not in logs, logs


def _late(
    db: Database, sink: Receiver | ReceiverProcess, created: dict[str, float], second: Process
) -> str:
    """What a failed lag check needs to be understood: each late message's outbox row (its
    attempts and last error tell a retry from a slow first send) and the other manager's log."""
    arrived = [(json.loads(body)["lease"]["id"], at) for at, _, body in sink.arrivals]
    late = {lease: round(at - created[lease], 3) for lease, at in arrived}
    late = {lease: lag for lease, lag in late.items() if lag >= 1.0}
    with db.reader() as session:
        rows = [
            (m.id, m.lease_id, m.attempts, m.last_error, m.created_at, m.delivered_at)
            for m in outbox.by_status(session, outbox.DELIVERED)
            if m.url == sink.url and m.lease_id in late
        ]
    second.log.seek(0)
    return f"late {late}; rows {rows}; the other manager's log:\n{second.log.read()}"


def _wait_for_output(process: Process, text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.log.seek(0)
        if text in process.log.read():
            return
        assert process.proc.poll() is None, process.stop()
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} from climate {' '.join(process.args)}")


def _wait_until_dead(db: Database, expected: dict[str, int], deadline: float) -> None:
    """Every message of each sink in ``expected`` dead-lettered after its three attempts."""
    while True:
        with db.reader() as session:
            dead = outbox.by_status(session, outbox.DEAD)
            counts = {url: sum(1 for m in dead if m.url == url) for url in expected}
            if counts == expected:
                assert {m.attempts for m in dead} == {3}
                return
        assert time.monotonic() < deadline, counts
        time.sleep(0.1)


def _slow_sink_messages(
    settings: Settings,
    db: Database,
    slow: Receiver,
    count: int,
    timeout: float,
    concurrency: int = 8,
) -> ServiceContext:
    """``count`` messages due now for ``slow``, tried once each, with this HTTP timeout."""
    ctx = build_context(
        settings.model_copy(
            update={
                "webhooks": (slow.url,),
                "webhook_timeout_seconds": timeout,
                "webhook_max_attempts": 1,
                "webhook_concurrency": concurrency,
            }
        ),
        db,
        SystemClock(),
    )
    with db.transaction() as session:
        for i in range(count):
            payload = {"event": "lease.create", "n": i}
            outbox.enqueue(session, [slow.url], "lease.create", payload, ctx.clock.now())
    return ctx


def test_a_claim_holds_until_its_messages_are_sent_so_a_second_deliverer_sends_none_again(
    settings: Settings, db: Database
) -> None:
    slow = Receiver(hold=30)
    ctx = _slow_sink_messages(settings, db, slow, count=6, timeout=0.5)
    deliverers = [Deliverer(ctx), Deliverer(ctx)]  # two managers' deliverers
    try:
        for deliverer in deliverers:
            deliverer.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with db.reader() as session:
                if len(outbox.by_status(session, outbox.DEAD)) == 6:
                    break
            time.sleep(0.1)
    finally:
        for deliverer in deliverers:
            deliverer.stop()
        slow.close()
    sent = [headers[DELIVERY_HEADER] for _, headers, _ in slow.arrivals]
    assert len(set(sent)) == len(sent) == 6, sent


def test_the_deliverers_claims_and_outcomes_commit_without_waiting_for_the_disk(
    settings: Settings, pg_url: str, receiver: Receiver
) -> None:
    """PostgreSQL: the deliverer's own writes (its claim, the outcome) are committed without
    waiting for a WAL flush, so a send never waits behind the disk; the change that wrote the
    message still waits for it, as every other change does."""
    _reset_pg(pg_url)
    db = Database(pg_url)
    writes: list[tuple[str, str]] = []  # (synchronous_commit in force, statement) on the outbox

    def watch(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        words = statement.split()
        if words[0] in ("INSERT", "UPDATE") and "outbox" in words[:3]:
            shown = conn.connection.driver_connection.execute("SHOW synchronous_commit")
            writes.append((shown.fetchone()[0], words[0]))

    ctx = build_context(settings.model_copy(update={"webhooks": (receiver.url,)}), db)
    event.listen(db.engine, "before_cursor_execute", watch)
    try:
        with db.transaction() as session:
            outbox.enqueue(session, [receiver.url], "lease.create", {"event": "x"}, ctx.clock.now())
        assert Deliverer(ctx).deliver_due() == 1
    finally:
        event.remove(db.engine, "before_cursor_execute", watch)
        db.dispose()
    assert len(receiver.received) == 1
    assert writes[0] == ("on", "INSERT")
    assert writes[1:] == [("off", "UPDATE")] * 2  # the claim, then the outcome


def test_a_stopping_deliverer_hands_back_the_messages_it_claimed_and_did_not_send(
    settings: Settings, db: Database
) -> None:
    slow = Receiver(hold=30)
    ctx = _slow_sink_messages(settings, db, slow, count=3, timeout=1.0)
    deliverer = Deliverer(ctx)
    try:
        deliverer.start()
        deadline = time.monotonic() + 10
        while not slow.arrivals and time.monotonic() < deadline:
            time.sleep(0.02)
        deliverer.stop()
    finally:
        slow.close()
    assert len(slow.arrivals) == 1
    stopped = ctx.clock.now()
    with db.reader() as session:
        (dead,) = outbox.by_status(session, outbox.DEAD)
        assert "ReadTimeout" in (dead.last_error or "")
        rest = outbox.by_status(session, outbox.PENDING)
    assert [(m.attempts, m.next_attempt_at <= stopped) for m in rest] == [(0, True), (0, True)]


def test_a_failing_sink_gives_up_its_thread_after_each_attempt(
    settings: Settings, db: Database
) -> None:
    """One thread for all sinks: five messages to a slow receiver, due first, hold up a healthy
    receiver's message for one timeout, not five."""
    slow, healthy = Receiver(hold=30), Receiver()
    ctx = _slow_sink_messages(settings, db, slow, count=5, timeout=1.0, concurrency=1)
    with db.transaction() as session:
        payload = {"event": "lease.create"}
        outbox.enqueue(session, [healthy.url], "lease.create", payload, ctx.clock.now())
    deliverer = Deliverer(ctx)
    started = time.monotonic()
    try:
        deliverer.start()
        while not healthy.arrivals and time.monotonic() < started + 10:
            time.sleep(0.02)
    finally:
        deliverer.stop()
        slow.close()
        healthy.close()
    ((arrived, _, _),) = healthy.arrivals
    assert arrived - started < 3.0
    assert len(slow.arrivals) < 5


class DribblingReceiver:
    """A real HTTP server on loopback that answers 200, one byte every ``gap`` seconds: no single
    read waits longer than ``gap``, however long the whole answer takes."""

    def __init__(self, gap: float) -> None:
        self.requests = 0
        self.closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                    if receiver.closing.wait(gap):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_receiver_dribbling_its_answer_fails_the_attempt_within_the_claimed_time(
    settings: Settings, db: Database
) -> None:
    """Each read gets a byte before the timeout, but the whole answer (38 bytes at 0.2 s) would
    take 7.6 s: the attempt fails after 3 x the timeout (the time its claim was sized for),
    instead of holding the sink's thread past its claim, when another manager sends it again."""
    dribbler = DribblingReceiver(gap=0.2)
    try:
        ctx = build_context(
            settings.model_copy(
                update={"webhooks": (dribbler.url,), "webhook_timeout_seconds": 0.5}
            ),
            db,
            SystemClock(),
        )
        add_hosts(HostService(ctx), 1)
        LeaseService(ctx).create(
            ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
        )
        began = time.monotonic()
        assert Deliverer(ctx).deliver_due() == 1
        took = time.monotonic() - began
    finally:
        dribbler.close()
    assert dribbler.requests == 1
    assert took < 1.5 + 1.0, took
    with db.reader() as session:
        (pending,) = outbox.by_status(session, outbox.PENDING)
        assert pending.attempts == 1
        assert "Timeout" in (pending.last_error or ""), pending.last_error


def test_what_the_manager_writes_is_sent_at_once_not_when_the_deliverer_next_looks(
    settings: Settings, sqlite_url: str
) -> None:
    """``climate serve`` on SQLite: a lease's start and end are written to the outbox by the
    manager, which woke nobody; the deliverer, idle since the creation was sent, slept its
    ``max_wait_seconds`` (30 s) and sent them up to that late."""
    receiver = ReceiverProcess()
    hooks = settings.model_copy(update={"webhooks": (receiver.url,)})
    try:
        with serve(hooks, sqlite_url) as server:
            api = server.url
            assert httpx.post(f"{api}/v1/os-hosts", json={"name": "h1"}).status_code == 201
            now = dt.datetime.now(dt.UTC)
            start, end = now + dt.timedelta(seconds=3), now + dt.timedelta(seconds=5)
            offset = time.monotonic() - now.timestamp()  # monotonic = wall clock + offset
            body = {
                "name": "soon",
                "start_date": start.strftime("%Y-%m-%d %H:%M:%S"),
                "end_date": end.strftime("%Y-%m-%d %H:%M:%S"),
                "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
            }
            assert httpx.post(f"{api}/v1/leases", json=body).status_code == 201
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline and not any(
                headers["X-Climate-Event"] == "lease.end" for _, headers, _ in receiver.arrivals
            ):
                time.sleep(0.05)
    finally:
        receiver.close()
    arrived = {headers["X-Climate-Event"]: at for at, headers, _ in receiver.arrivals}
    assert {"lease.create", "lease.start", "lease.end"} <= set(arrived), sorted(arrived)
    # Its time is the whole second the date was cut to: at most 1 s before the one asked for.
    assert arrived["lease.start"] - (start.replace(microsecond=0).timestamp() + offset) < 2.0
    assert arrived["lease.end"] - (end.replace(microsecond=0).timestamp() + offset) < 2.0


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy variable from the machine's environment: each test sets its own."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def _one_webhook_attempt(settings: Settings, db: Database, url: str) -> tuple[float, str | None]:
    """Queue one lease.create to ``url`` with a 0.3 s timeout, make one attempt: how long it
    took and its error."""
    ctx = build_context(
        settings.model_copy(update={"webhooks": (url,), "webhook_timeout_seconds": 0.3}),
        db,
        SystemClock(),
    )
    add_hosts(HostService(ctx), 1)
    LeaseService(ctx).create(
        ALICE, host_request("l1", T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
    )
    deliverer = Deliverer(ctx)
    began = time.monotonic()
    assert deliverer.deliver_due() == 1
    took = time.monotonic() - began
    deliverer.stop()
    with db.reader() as session:
        (message,) = session.scalars(select(OutboxMessage)).all()
        return took, message.last_error


def test_webhooks_go_through_the_http_proxy_the_environment_names(
    settings: Settings, db: Database, receiver: Receiver, proxy_env: pytest.MonkeyPatch
) -> None:
    """The receiver stands in for the proxy: a host name nothing resolves reaches it."""
    proxy_env.setenv("HTTP_PROXY", receiver.url.removesuffix("/hook"))
    took, error = _one_webhook_attempt(settings, db, "http://hooks.climate-test.invalid/hook")
    assert error is None
    ((headers, _),) = receiver.received
    assert headers["Host"] == "hooks.climate-test.invalid"


def test_hosts_in_no_proxy_are_reached_directly(
    settings: Settings, db: Database, receiver: Receiver, proxy_env: pytest.MonkeyPatch
) -> None:
    proxy_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    proxy_env.setenv("NO_PROXY", "127.0.0.1")
    took, error = _one_webhook_attempt(settings, db, receiver.url)
    assert error is None
    assert len(receiver.received) == 1


def test_a_proxy_dribbling_its_answer_fails_the_attempt_within_its_deadline(
    settings: Settings, db: Database, proxy_env: pytest.MonkeyPatch
) -> None:
    """The proxy's answer (38 bytes at 0.2 s) would take 7.6 s: the attempt, proxy included,
    ends after 3 x the timeout like any other."""
    dribbler = DribblingReceiver(gap=0.2)
    try:
        proxy_env.setenv("HTTP_PROXY", dribbler.url.removesuffix("/hook"))
        took, error = _one_webhook_attempt(settings, db, "http://hooks.climate-test.invalid/hook")
    finally:
        dribbler.close()
    assert dribbler.requests == 1
    assert took < 0.9 + 1.0, took
    assert "Timeout" in (error or ""), error


def test_a_socks_proxy_in_the_environment_is_a_failed_attempt_naming_it(
    settings: Settings, db: Database, proxy_env: pytest.MonkeyPatch
) -> None:
    proxy_env.setenv("ALL_PROXY", "socks5://user:pw@127.0.0.1:1080")
    _, error = _one_webhook_attempt(settings, db, "http://hooks.climate-test.invalid/hook")
    assert error == (
        "ProxyError: webhooks go through http:// and https:// proxies only, "
        "not 'socks5://user:***@127.0.0.1:1080'"
    )


SILENT_DNS_CHILD = """
import json, socket, subprocess, sys, threading, time
subprocess.run(["mount", "--bind", sys.argv[1], "/etc/resolv.conf"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))
queries = []
def swallow():  # takes every query, answers none
    while True:
        queries.append(dns.recvfrom(512))
threading.Thread(target=swallow, daemon=True).start()
from climate.db.tables import OutboxMessage
from climate.notify.deadline import deadline_client
from climate.notify.sinks import WebhookSink
sink = WebhookSink("http://hooks.slow-dns.test/hook", deadline_client(0.3), "", 0.3)
began = time.monotonic()
try:
    error = sink.send(OutboxMessage(id=1, topic="lease.create", payload={}))
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"took": time.monotonic() - began, "error": error, "queries": len(queries)}))
"""


def test_a_dns_server_that_does_not_answer_fails_the_attempt_within_its_deadline(
    tmp_path: Any,
) -> None:
    """Resolution through a real DNS server that takes queries and answers none, in a network
    and mount namespace of the test's own (its resolv.conf names that server): getaddrinfo waits
    out the resolver's timeouts (2 x 5 s), far past the attempt's deadline (3 x 0.3 s)."""
    if subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True).returncode:
        pytest.skip("needs root to make a network namespace (unshare)")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(Path(__file__).parents[1] / "src")) if p
    )
    child = subprocess.run(
        ["unshare", "--mount", "--net", sys.executable, "-c", SILENT_DNS_CHILD, str(resolv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    outcome = json.loads(child.stdout)
    assert outcome["queries"] >= 1  # the name was looked up through the silent server
    assert outcome["took"] < 0.9 + 0.5, outcome
    assert outcome["error"] == (
        "ConnectTimeout: looking up hooks.slow-dns.test took longer than its deadline"
    )
