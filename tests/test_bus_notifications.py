"""Notifications on the message bus, as Blazar 18 sends them, through a real RabbitMQ.

The broker is the machine's (127.0.0.1:5672, guest/guest, or ``CLIMATE_TEST_AMQP``). Outages
are made with a TCP proxy between Climate and the broker that the test stops and starts again;
the machine's broker is shared and never stopped (the rig's own broker is, in
tests/openstack/test_bus_outage.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from sqlalchemy import select

from climate.config import Settings, load_settings
from climate.db import outbox
from climate.db.engine import Database
from climate.db.tables import Lease, OutboxMessage
from climate.domain.clock import ManualClock, SystemClock
from climate.domain.status import LeaseType
from climate.errors import InvalidInput
from climate.notify.delivery import Deliverer
from climate.runtime import Workers, build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ALICE, T0, free_port
from tests.helpers import add_hosts, host_request
from tests.test_notifications import Receiver

AMQP = os.environ.get("CLIMATE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
GOLDEN = Path(__file__).parent / "golden" / "notifications" / "blazar-18-lease.json"
HOUR = dt.timedelta(hours=1)


def _broker_address() -> tuple[str, int]:
    address = kombu.Connection(AMQP)
    return address.hostname or "127.0.0.1", int(address.port or 5672)


@pytest.fixture(scope="module")
def broker() -> tuple[str, int]:
    host, port = _broker_address()
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no RabbitMQ at {host}:{port}")
    return host, port


def _transport_url(host: str, port: int) -> str:
    return f"rabbit://guest:guest@{host}:{port}/"


class Queue:
    """A queue bound like an oslo.messaging notification consumer's (``<topic>.info`` on the
    ``openstack`` exchange), declared before anything is sent so nothing is missed."""

    def __init__(self, amqp: str = AMQP, topic: str | None = None) -> None:
        self.topic = topic or f"climate_test_{uuid.uuid4().hex}"
        self.connection = kombu.Connection(amqp)
        exchange = kombu.Exchange("openstack", type="topic", durable=False)
        name = f"{self.topic}.info"
        self.queue = kombu.Queue(name, exchange, routing_key=name, durable=False)
        self.queue(self.connection.default_channel).declare()

    def take(self, count: int, timeout: float = 10) -> list[dict[str, Any]]:
        """``count`` messages (each ``oslo.message`` decoded), then any extra that arrives within
        half a second, so a repeat would show."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        with self.connection.SimpleQueue(self.queue) as simple:
            while time.monotonic() < deadline:
                wait = 0.5 if len(got) >= count else deadline - time.monotonic()
                try:
                    message = simple.get(timeout=max(wait, 0.01))
                except simple.Empty:
                    if len(got) >= count:
                        break
                    continue
                envelope = dict(message.payload)
                envelope["oslo.message"] = json.loads(envelope["oslo.message"])
                message.ack()
                got.append(envelope)
        return got

    def close(self) -> None:
        self.queue(self.connection.default_channel).delete()
        self.connection.release()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Iterator[Database]:
    """For the tests on the real clock. (On PostgreSQL an in-process manager on the real clock
    starts leases late whatever the sink, webhooks too: left to its own issue.)"""
    database = Database(sqlite_url)
    yield database
    database.dispose()


@pytest.fixture
def queue(broker: tuple[str, int]) -> Iterator[Queue]:
    q = Queue()
    yield q
    q.close()


class Proxy:
    """A TCP forwarder to the broker on a port of its own, which can be stopped (every
    connection cut, new ones refused) and started again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.relaying = asyncio.Event()
        """Cleared by ``hold``: connections are accepted and wait, unanswered, until ``relay``."""
        self.generation = 0
        """Connections opened before ``silence`` have a lower generation, and relay nothing."""
        self.silent_below = 0
        self.loop.call_soon_threadsafe(self.relaying.set)
        self.start()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, generation: int
    ) -> None:
        try:
            while data := await reader.read(65536):
                if generation < self.silent_below:
                    await asyncio.Event().wait()  # for good: the connection stays open, mute
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.relaying.wait()
        generation = self.generation
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, upstream_writer}
        await asyncio.gather(
            self._pipe(reader, upstream_writer, generation),
            self._pipe(upstream_reader, writer, generation),
        )

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()
        await self.server.wait_closed()

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(5)

    def hold(self) -> None:
        """A broker that stalls: new connections are accepted and not answered."""
        self.loop.call_soon_threadsafe(self.relaying.clear)

    def relay(self) -> None:
        """The broker recovers: the held connections go through."""
        self.loop.call_soon_threadsafe(self.relaying.set)

    def silence(self) -> None:
        """The broker stops answering on the open connections, for good (a half-open
        connection: no reset ever comes); new connections go through."""

        def mute() -> None:
            self.generation += 1
            self.silent_below = self.generation

        self.loop.call_soon_threadsafe(mute)

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def proxy(broker: tuple[str, int]) -> Iterator[Proxy]:
    p = Proxy(broker)
    yield p
    p.close()


def _bus_settings(settings: Settings, url: str, topic: str, **more: object) -> Settings:
    return settings.model_copy(
        update={"notification_transport_url": url, "notification_topics": (topic,), **more}
    )


def _keys(value: dict[str, Any]) -> set[str]:
    return set(value)


RAN = {f"lease.event.{kind}": kind for kind in ("start_lease", "before_end_lease", "end_lease")}
"""The notification of an event that ran -> that event's type."""


def _statuses(payload: dict[str, Any], event_type: str) -> set[str]:
    return {e["status"] for e in payload["events"] if e["event_type"] == event_type}


def _golden() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads(GOLDEN.read_text())
    return loaded


def _started(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    broker: tuple[str, int],
    queue: Queue,
    receiver: Receiver,
) -> tuple[LeaseService, Workers, Lease]:
    """A lease of one host started at T0, its notifications sent to the bus and ``receiver``."""
    ctx = build_context(
        _bus_settings(settings, _transport_url(*broker), queue.topic, webhooks=(receiver.url,)),
        db,
        clock,
    )
    add_hosts(HostService(ctx), 1)
    leases, workers = LeaseService(ctx), build_workers(ctx)
    lease = leases.create(ALICE, host_request("l1", T0, T0 + 2 * HOUR))
    workers.manager.run_due()
    return leases, workers, lease


def test_bus_notifications_carry_blazar_18s_event_types_envelope_and_payload_keys(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    broker: tuple[str, int],
    queue: Queue,
    receiver: Receiver,
) -> None:
    leases, workers, lease = _started(settings, db, clock, broker, queue, receiver)
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * HOUR))
    clock.set(T0 + 2 * HOUR)
    workers.manager.run_due()  # the warning runs...
    leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 4 * HOUR))  # ... and is re-armed
    clock.set(T0 + 4 * HOUR)
    workers.manager.run_due()
    leases.delete(ALICE, lease.id)
    while workers.deliverer.deliver_due():
        pass
    got = queue.take(9)
    golden = _golden()

    assert [m["oslo.message"]["event_type"] for m in got] == [
        "lease.create",
        "lease.event.start_lease",
        "lease.update",
        "lease.event.before_end_lease",
        "lease.update",
        "lease.event.before_end_lease.stop",
        "lease.event.before_end_lease",
        "lease.event.end_lease",
        "lease.delete",
    ]
    stop = got[5]["oslo.message"]["payload"]
    assert [e["status"] for e in stop["events"] if e["event_type"] == "before_end_lease"] == [
        "DONE",
        "UNDONE",
    ]
    recorded = {m["oslo.message"]["event_type"]: m for m in golden}
    assert set(recorded) == {m["oslo.message"]["event_type"] for m in got}
    blazar_order = [m["oslo.message"]["event_type"] for m in golden]
    stop_at = blazar_order.index("lease.event.before_end_lease.stop")
    assert blazar_order[stop_at - 1 : stop_at + 2] == [
        "lease.update",
        "lease.event.before_end_lease.stop",
        "lease.event.before_end_lease",
    ]
    for envelope in got:
        blazar = recorded[envelope["oslo.message"]["event_type"]]
        blazar_message = blazar["oslo.message"]
        assert envelope["oslo.version"] == blazar["oslo.version"] == "2.0"
        message = envelope["oslo.message"]
        envelope_keys = {k for k in message if not k.startswith("_")}
        assert envelope_keys == {k for k in blazar_message if not k.startswith("_")}
        assert message["publisher_id"] == blazar_message["publisher_id"] == "blazar.lease"
        assert message["priority"] == blazar_message["priority"] == "INFO"
        payload, expected = message["payload"], blazar_message["payload"]
        assert _keys(payload) == _keys(expected)
        assert _keys(payload["reservations"][0]) == _keys(expected["reservations"][0])
        assert _keys(payload["events"][0]) == _keys(expected["events"][0])
        assert payload["lease_id"] == lease.id
        # lease.update and the stop say UPDATING, lease.delete DELETING, as in Blazar.
        assert payload["status"] == expected["status"], message["event_type"]
        if kind := RAN.get(message["event_type"]):  # the event that ran is DONE, as in Blazar
            assert _statuses(payload, kind) == _statuses(expected, kind) == {"DONE"}, kind
        for name in ("start_date", "end_date"):
            assert len(payload[name]) == len(expected[name]) and payload[name][10] == "T"
        assert payload["created_at"][10] == expected["created_at"][10] == " "
    # Each message has an id of its own; the webhooks got theirs beside them.
    assert len({m["oslo.message"]["message_id"] for m in got}) == 9
    assert len(receiver.received) == 9
    assert json.loads(receiver.received[5][1])["event"] == "lease.before_end.stop"


def test_a_running_lease_deleted_ends_with_its_lease_delete_on_the_bus_as_in_blazar(
    settings: Settings,
    db: Database,
    clock: ManualClock,
    broker: tuple[str, int],
    queue: Queue,
    receiver: Receiver,
) -> None:
    """Blazar's delete_lease takes a running lease's resources back itself and sends only
    lease.delete; Climate's manager ends it afterwards, which webhooks see as lease.end."""
    leases, workers, lease = _started(settings, db, clock, broker, queue, receiver)
    clock.set(T0 + HOUR / 2)
    leases.delete(ALICE, lease.id)
    workers.manager.run_due()
    while workers.deliverer.deliver_due():
        pass
    assert [m["oslo.message"]["event_type"] for m in queue.take(3)] == [
        "lease.create",
        "lease.event.start_lease",
        "lease.delete",
    ]
    assert [json.loads(body)["event"] for _, body in receiver.received] == [
        "lease.create",
        "lease.start",
        "lease.delete",
        "lease.end",
    ]


def test_a_leases_create_start_before_end_and_end_arrive_in_order_once_each(
    settings: Settings, sqlite_db: Database, broker: tuple[str, int], queue: Queue
) -> None:
    ctx = build_context(
        _bus_settings(settings, _transport_url(*broker), queue.topic), sqlite_db, SystemClock()
    )
    add_hosts(HostService(ctx), 1)
    workers = build_workers(ctx)
    workers.start()
    try:
        now = dt.datetime.now(dt.UTC)
        LeaseService(ctx).create(ALICE, host_request("l1", now, now + dt.timedelta(seconds=2)))
        got = queue.take(4)
    finally:
        workers.stop()
    assert [m["oslo.message"]["event_type"] for m in got] == [
        "lease.create",
        "lease.event.start_lease",
        "lease.event.before_end_lease",
        "lease.event.end_lease",
    ]
    assert [m["oslo.message"]["payload"]["status"] for m in got] == [
        "PENDING",
        "ACTIVE",
        "ACTIVE",
        "TERMINATED",
    ]


def _behind(
    proxy: Proxy, settings: Settings, db: Database, queue: Queue, **changes: object
) -> ServiceContext:
    """A context whose bus goes to RabbitMQ through ``proxy``."""
    bus = _bus_settings(settings, _transport_url("127.0.0.1", proxy.port), queue.topic, **changes)
    return build_context(bus, db, SystemClock())


def test_every_notification_arrives_once_after_the_broker_comes_back(
    settings: Settings, sqlite_db: Database, proxy: Proxy, queue: Queue
) -> None:
    """The broker unreachable for 5 s while leases start and end: every notification arrives
    after it is back, none twice."""
    ctx = _behind(proxy, settings, sqlite_db, queue)
    add_hosts(HostService(ctx), 3)
    workers = build_workers(ctx)
    workers.start()
    try:
        proxy.stop()
        now = dt.datetime.now(dt.UTC)
        for index in range(3):
            end = now + dt.timedelta(seconds=1 + index)
            LeaseService(ctx).create(ALICE, host_request(f"l{index}", now, end))
        time.sleep(5)
        with sqlite_db.reader() as session:
            waiting = outbox.by_status(session, outbox.PENDING)
            assert waiting and all(m.attempts >= 1 and m.last_error for m in waiting)
        proxy.start()
        got = queue.take(12, timeout=30)
    finally:
        workers.stop()
    seen = [(m["oslo.message"]["payload"]["name"], m["oslo.message"]["event_type"]) for m in got]
    assert sorted(seen) == sorted(
        (f"l{i}", kind)
        for i in range(3)
        for kind in (
            "lease.create",
            "lease.event.start_lease",
            "lease.event.before_end_lease",
            "lease.event.end_lease",
        )
    )
    assert len({m["oslo.message"]["message_id"] for m in got}) == 12


def test_a_broker_that_does_not_answer_is_a_failed_attempt_after_the_timeout(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    silent = socket.create_server(("127.0.0.1", free_port()))  # accepts, never answers
    try:
        ctx = build_context(
            _bus_settings(
                settings,
                _transport_url("127.0.0.1", silent.getsockname()[1]),
                "climate_test_silent",
                notification_timeout_seconds=1.0,
            ),
            db,
            clock,
        )
        add_hosts(HostService(ctx), 1)
        LeaseService(ctx).create(ALICE, host_request("l1", T0 + HOUR, T0 + 2 * HOUR))
        deliverer = Deliverer(ctx)
        started = time.monotonic()
        assert deliverer.deliver_due() == 1
        assert time.monotonic() - started < 10
        with db.reader() as session:
            (message,) = outbox.by_status(session, outbox.PENDING)
        assert message.attempts == 1
        assert message.last_error == "the message bus did not take the message within 1 s"
        deliverer.stop()
    finally:
        silent.close()


def test_a_broker_that_stalls_then_recovers_gets_each_notification_once(
    settings: Settings, sqlite_db: Database, proxy: Proxy, queue: Queue
) -> None:
    """A broker that accepts connections and answers nothing for 4 s: the send stuck on it is
    given up after the timeout but goes through when the broker recovers. Sends queued behind it
    would go out then too, and every message given up is retried: the broker got each one
    several times. Now nothing starts behind a stuck send, and the stuck one's retry knows that
    the broker took it."""
    ctx = _behind(proxy, settings, sqlite_db, queue, notification_timeout_seconds=1.0)
    add_hosts(HostService(ctx), 3)
    proxy.hold()
    workers = build_workers(ctx)
    workers.start()
    try:
        now = dt.datetime.now(dt.UTC)
        for index in range(3):
            LeaseService(ctx).create(ALICE, host_request(f"l{index}", now + HOUR, now + 2 * HOUR))
        time.sleep(4)
        proxy.relay()
        got = queue.take(3, timeout=15)
        # The retry of the message whose given-up send went through is recorded after its
        # backoff (up to 8 s), without sending it again.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with sqlite_db.reader() as session:
                if len(outbox.by_status(session, outbox.DELIVERED)) == 3:
                    break
            time.sleep(0.2)
        got += queue.take(0, timeout=1)
    finally:
        workers.stop()
    names = sorted(m["oslo.message"]["payload"]["name"] for m in got)
    assert names == ["l0", "l1", "l2"]
    with sqlite_db.reader() as session:
        assert len(outbox.by_status(session, outbox.DELIVERED)) == 3


def test_a_connection_the_broker_stops_answering_for_good_is_dropped_and_sending_resumes(
    settings: Settings, sqlite_db: Database, proxy: Proxy, queue: Queue
) -> None:
    """The broker goes silent on the open connection and never answers on it again, while new
    connections work. oslo.messaging waited on the silent one without end, and every later send
    failed at once behind it: no notification ever went out again. Now the stuck send's
    connections are shut after 5 timeouts and the next attempt opens a new one."""
    ctx = _behind(proxy, settings, sqlite_db, queue, notification_timeout_seconds=1.0)
    add_hosts(HostService(ctx), 2)
    workers = build_workers(ctx)
    workers.start()
    try:
        now = dt.datetime.now(dt.UTC)
        LeaseService(ctx).create(ALICE, host_request("before", now + HOUR, now + 2 * HOUR))
        assert len(queue.take(1)) == 1
        proxy.silence()
        LeaseService(ctx).create(ALICE, host_request("after", now + HOUR, now + 2 * HOUR))
        got = queue.take(1, timeout=25)
    finally:
        workers.stop()
    assert [m["oslo.message"]["payload"]["name"] for m in got] == ["after"]
    with sqlite_db.reader() as session:
        assert len(outbox.by_status(session, outbox.DELIVERED)) == 2


@pytest.mark.parametrize(
    "bad",
    [
        "rabbit//127.0.0.1:5672/",
        "carrier-pigeon://guest:s3cret@127.0.0.1:5672/",
        "rabbit://guest:s3cret@127.0.0.1:99999/",
        "rabbit://guest:s3cret@127.0.0.1:port/",
        "rabbit://",
        "rabbit://guest:s3cret@rabbit host:5672/",
    ],
)
def test_a_malformed_transport_url_is_refused_at_start_up_naming_the_setting(bad: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        load_settings(env={"CLIMATE_NOTIFICATION_TRANSPORT_URL": bad})
    assert refused.value.field == "CLIMATE_NOTIFICATION_TRANSPORT_URL"
    assert "not an oslo.messaging transport URL" in refused.value.message
    assert "s3cret" not in refused.value.message


def test_bus_settings_are_read_from_the_environment() -> None:
    loaded = load_settings(
        env={
            "CLIMATE_NOTIFICATION_TRANSPORT_URL": "rabbit://u:p@a:5672,u:p@b:5672/vhost",
            "CLIMATE_NOTIFICATION_TOPICS": "notifications, billing",
        }
    )
    assert loaded.notification_sinks == ("bus:notifications", "bus:billing")
    assert load_settings(env={}).notification_sinks == ()
    with pytest.raises(InvalidInput) as refused:
        load_settings(env={"CLIMATE_NOTIFICATION_TOPICS": ""})
    assert refused.value.field == "CLIMATE_NOTIFICATION_TOPICS"


def _bus_event_types(db: Database, lease_id: str) -> list[str]:
    with db.reader() as session:
        rows = session.scalars(
            select(OutboxMessage)
            .where(OutboxMessage.lease_id == lease_id, OutboxMessage.url.startswith("bus:"))
            .order_by(OutboxMessage.id)
        ).all()
        return [row.topic for row in rows]


def test_holds_confirmed_and_lapsed_have_event_types_of_their_own(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = build_context(
        _bus_settings(settings, "rabbit://guest:guest@127.0.0.1:5672/", "n"), db, clock
    )
    add_hosts(HostService(ctx), 2)
    leases, manager = LeaseService(ctx), build_workers(ctx).manager
    window = (T0 + HOUR, T0 + 2 * HOUR)
    kept = leases.create(
        ALICE, dataclasses.replace(host_request("kept", *window), hold=dt.timedelta(minutes=10))
    )
    leases.confirm(ALICE, kept.id)
    lapsing = leases.create(
        ALICE, dataclasses.replace(host_request("lapsing", *window), hold=dt.timedelta(minutes=1))
    )
    clock.advance(dt.timedelta(minutes=2))
    manager.serve_queue()
    assert _bus_event_types(db, kept.id) == ["lease.create", "lease.hold.confirm"]
    assert _bus_event_types(db, lapsing.id) == ["lease.create", "lease.hold.expire"]


def test_a_waiting_lease_admitted_from_the_queue_has_an_event_type_of_its_own(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = build_context(
        _bus_settings(settings, "rabbit://guest:guest@127.0.0.1:5672/", "n"), db, clock
    )
    add_hosts(HostService(ctx), 1)
    leases, manager = LeaseService(ctx), build_workers(ctx).manager
    leases.create(ALICE, host_request("occupant", None, T0 + HOUR))
    waiting = leases.create(
        ALICE,
        dataclasses.replace(
            host_request("waiting", None, T0 + HOUR),
            lease_type=LeaseType.BEST_EFFORT,
            deadline=T0 + 10 * HOUR,
        ),
    )
    manager.run_due()
    clock.set(T0 + HOUR)
    manager.run_due()
    manager.serve_queue()
    assert _bus_event_types(db, waiting.id)[:2] == ["lease.create", "lease.waiting.admit"]
