"""Notifications on the message bus, as OpenStack Blazar sends them (oslo.messaging).

Each configured topic is a sink of its own (``bus:<topic>``), fed from the outbox like a webhook.
A row holds the whole oslo.messaging message, rendered when the change was written: its
``message_id`` is fixed then, so a message sent twice (a manager killed after the broker took it)
carries the same id both times and consumers drop the repeat by it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Literal

from climate import wire
from climate.addresses import BUS_PREFIX, oslo_config, oslo_messaging, redact

if TYPE_CHECKING:
    from climate.db.tables import Event, Lease, OutboxMessage, Reservation

LOG = logging.getLogger(__name__)
PRIORITY = "INFO"
Driver = Literal["messagingv2", "messaging"]

EVENT_TYPES: Mapping[str, str] = {
    "lease.create": "lease.create",
    "lease.update": "lease.update",
    "lease.delete": "lease.delete",
    "lease.start": "lease.event.start_lease",
    "lease.before_end": "lease.event.before_end_lease",
    "lease.before_end.stop": "lease.event.before_end_lease.stop",
    "lease.end": "lease.event.end_lease",
    "lease.error": "lease.error",
    "lease.degraded": "lease.degraded",
    "lease.healed": "lease.healed",
    "lease.idle.warning": "lease.idle.warning",
    "lease.idle.release": "lease.idle.release",
}
"""Climate's webhook topic -> the bus event type. The first seven are Blazar's
(``lease.before_end.stop``: a lease whose warning had run got a later end, so it will be warned
again); ``lease.error`` (a lease that failed for good), ``lease.degraded`` and ``lease.healed``
(docs/healing.md), ``lease.idle.warning`` and ``lease.idle.release`` (docs/idle.md) and the
finer types callers pass (``lease.hold.confirm``, ...) are Climate's own, named the same way."""

STATUS_WHILE_SENT: Mapping[str, str] = {
    "lease.update": "UPDATING",
    "lease.event.before_end_lease.stop": "UPDATING",
    "lease.delete": "DELETING",
}
"""Blazar sends these from inside ``update_lease`` and ``delete_lease``, while the lease has
that transitional status: their payload's ``status`` says so, whatever the lease's status
before and after (a deleted lease that had ended is ``DELETING`` too)."""

DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"
"""Lease and event dates as Blazar's notifications show them..."""
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
"""...and row stamps (created_at, updated_at) and the message's timestamp."""

RESERVATION_KEYS: Mapping[str, tuple[str, ...]] = {
    "physical:host": ("hypervisor_properties", "resource_properties", "before_end", "min", "max"),
    "virtual:instance": (
        "vcpus",
        "memory_mb",
        "disk_gb",
        "amount",
        "affinity",
        "flavor_id",
        "aggregate_id",
        "server_group_id",
        "resource_properties",
    ),
    "virtual:floatingip": ("network_id", "amount"),
}
"""The keys Blazar's ``Reservation.to_dict`` adds for each of its resource types; a type Blazar
does not have carries its request's parameters."""


def _date(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).strftime(DATE_FORMAT)


def _stamp(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).strftime(STAMP_FORMAT)


def _reservation(row: Reservation) -> dict[str, Any]:
    """A reservation as Blazar's ``Reservation.to_dict`` gives it."""
    shown = wire.reservation(row)
    keys = RESERVATION_KEYS.get(row.resource_type, tuple(row.params))
    body = {key: shown[key] for key in keys if key in shown}
    body.update(
        {
            "id": row.id,
            "lease_id": row.lease_id,
            "resource_id": row.resource_id,
            "resource_type": row.resource_type,
            "status": row.status,
            "missing_resources": row.missing_resources,
            "resources_changed": row.resources_changed,
            "created_at": _stamp(row.created_at),
            "updated_at": _stamp(row.updated_at),
        }
    )
    return body


def _event(row: Event) -> dict[str, Any]:
    return {
        "id": row.id,
        "lease_id": row.lease_id,
        "event_type": row.event_type,
        "time": _date(row.time),
        "status": row.status,
        "created_at": _stamp(row.created_at),
        "updated_at": _stamp(row.updated_at),
    }


def lease_payload(event_type: str, lease: Lease) -> dict[str, Any]:
    """Blazar's ``notification.api.format_lease_payload`` for ``lease``, as it is when Blazar
    sends ``event_type``."""
    return {
        "lease_id": lease.id,
        "user_id": lease.user_id,
        "project_id": lease.project_id,
        "trust_id": lease.trust_id,
        "start_date": _date(lease.start_date),
        "end_date": _date(lease.end_date),
        "status": STATUS_WHILE_SENT.get(event_type, lease.status),
        "reservations": [_reservation(r) for r in lease.reservations],
        "events": [_event(e) for e in lease.events],
        "name": lease.name,
        "created_at": _stamp(lease.created_at),
        "updated_at": _stamp(lease.updated_at),
        "degraded": lease.degraded,
    }


def message(event_type: str, lease: Lease, publisher_id: str, now: dt.datetime) -> dict[str, Any]:
    """What one outbox row for the bus stores: the oslo.messaging context and message."""
    return {
        # oslo.context's fields, as Blazar's context sends them.
        "context": {
            "user_id": lease.user_id,
            "project_id": lease.project_id,
            "request_id": f"req-{uuid.uuid4()}",
            "global_request_id": None,
            "is_admin": False,
            "read_only": False,
            "show_deleted": False,
            "roles": [],
        },
        "message": {
            "message_id": str(uuid.uuid4()),
            "publisher_id": publisher_id,
            "event_type": event_type,
            "priority": PRIORITY,
            "payload": lease_payload(event_type, lease),
            "timestamp": _stamp(now),
        },
    }


STUCK_AFTER_TIMEOUTS = 5
"""A send given up that is still running this many timeouts after it started waits on a
connection the broker stopped answering: oslo.messaging may wait on it for ever (closing the
channel of a failed publish waits for the broker's answer without a timeout)."""


class _Link:
    """One transport with the thread that sends on it and the broker connections it opened,
    dropped as a whole when a send on it is stuck."""

    def __init__(self, oslo: Any, url: str) -> None:
        self.transport = oslo.get_notification_transport(oslo_config(), url=url)
        # One thread: sends are brief, and one that hangs makes the others time out too, as
        # they should (the broker is not answering).
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="climate-notify-bus")
        self.connections: list[Any] = []
        connections = getattr(self.transport._driver, "_connection_pool", None)
        if connections is not None:
            # oslo.messaging keeps no list of the connections it hands out: the pool's factory
            # is the one place that sees each of them.
            create = connections.create

            def create_and_keep(*args: Any, **kwargs: Any) -> Any:
                connection = create(*args, **kwargs)
                self.connections.append(connection)
                return connection

            connections.create = create_and_keep

    def cut(self) -> None:
        """Shut the sockets of every connection: a thread blocked reading one wakes with an
        error (closing a socket from another thread would not wake it)."""
        for connection in list(self.connections):
            amqp = getattr(getattr(connection, "connection", None), "_connection", None)
            sock = getattr(getattr(amqp, "transport", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self, wait: float) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        threading.Thread(
            target=self._cleanup, args=(wait,), name="climate-notify-bus-drop", daemon=True
        ).start()

    def _cleanup(self, wait: float) -> None:
        # The send thread first, holding its connection's lock, then the connections' heartbeat
        # threads; neither may outlive this thread for long on a broker that does not answer.
        deadline = time.monotonic() + wait
        while self.pool._threads and time.monotonic() < deadline:
            if not any(t.is_alive() for t in self.pool._threads):
                break
            self.cut()
            time.sleep(0.1)
        with contextlib.suppress(Exception):
            self.transport.cleanup()


class Bus:
    """One oslo.messaging notification transport, shared by every topic's sink.

    It sends through the transport itself rather than an ``oslo_messaging.Notifier``: the
    Notifier (and its drivers) log a failed send and return as if it had worked, and the outbox
    needs to know, to try again. ``retry=0`` makes one attempt to reach the broker; a send that
    hangs (a broker that accepts connections and does not answer) is given up after ``timeout``,
    and one still hanging ``STUCK_AFTER_TIMEOUTS`` timeouts after it started takes its transport
    with it: its connections are shut and the next send opens new ones.
    """

    def __init__(self, url: str, driver: Driver, timeout: float) -> None:
        # Imported here, in the thread that builds the deliverer: imported first in one of its
        # sink threads, eventlet's greenlet state for that thread keeps it from ever exiting.
        self._oslo = oslo_messaging()
        self._url = url
        self._version = 2.0 if driver == "messagingv2" else 1.0
        self._timeout = timeout
        self._link: _Link | None = None
        self._abandoned: dict[tuple[str, str], tuple[Future[None], float, _Link]] = {}
        """Sends given up after ``timeout`` and still running, by (topic, message_id), with when
        they started and on which link: the broker may take them yet, so no other send starts
        behind them on their link (it would go out after they recover, and a message given up
        is retried: the broker would get it twice)."""
        self._taken_late: set[tuple[str, str]] = set()
        """Messages whose abandoned send went through after all: their retry is done already."""
        self._books = threading.Lock()

    def publish(self, topic: str, stored: Mapping[str, Any]) -> str | None:
        """Send one stored message on ``topic``: None once the broker has it, else why not."""
        body = dict(stored["message"])
        key = (topic, str(body["message_id"]))
        with self._books:
            for done in [k for k, (job, _, _) in self._abandoned.items() if job.done()]:
                job = self._abandoned.pop(done)[0]
                if not job.cancelled() and job.exception() is None:
                    self._taken_late.add(done)
            if key in self._taken_late:
                self._taken_late.discard(key)
                return None
            stuck = [started for _, started, link in self._abandoned.values() if link is self._link]
            if stuck:
                if time.monotonic() - min(stuck) < STUCK_AFTER_TIMEOUTS * self._timeout:
                    return (
                        "the message bus has not finished a send given up after "
                        f"{self._timeout:g} s; no other starts before it ends"
                    )
                LOG.warning(
                    "the message bus has not answered a send for %g s: its connections are "
                    "dropped, the next send opens new ones",
                    STUCK_AFTER_TIMEOUTS * self._timeout,
                )
                self._drop_link()
            if self._link is None:
                self._link = _Link(self._oslo, self._url)
            link = self._link
        target = self._oslo.Target(topic=f"{topic}.{body['priority'].lower()}")
        started = time.monotonic()
        try:
            job = link.pool.submit(self._send, link, target, dict(stored["context"]), body)
        except RuntimeError:  # the link was dropped by a concurrent send, or closed
            return "the message bus connection was dropped; the next attempt opens a new one"
        try:
            job.result(timeout=self._timeout)
        except FutureTimeout:
            if not job.cancel():
                with self._books:
                    self._abandoned[key] = (job, started, link)
            return f"the message bus did not take the message within {self._timeout:g} s"
        except Exception as exc:
            return f"{type(exc).__name__}: {redact(str(exc))}"
        return None

    def _send(
        self, link: _Link, target: Any, context: dict[str, Any], body: dict[str, Any]
    ) -> None:
        link.transport._send_notification(target, context, body, version=self._version, retry=0)

    def _drop_link(self) -> None:
        if self._link is not None:
            self._link.close(wait=STUCK_AFTER_TIMEOUTS * self._timeout)
            self._link = None

    def close(self) -> None:
        with self._books:
            self._drop_link()


class BusSink:
    """The outbox messages of one topic (rows whose ``url`` is ``bus:<topic>``)."""

    def __init__(self, key: str, bus: Bus | None, timeout: float) -> None:
        self.key = key
        self.send_seconds = timeout
        self._topic = key.removeprefix(BUS_PREFIX)
        self._bus = bus

    def send(self, message: OutboxMessage) -> str | None:
        if self._bus is None:
            # Queued while there was a transport URL, and there is none now.
            return "notification_transport_url is not set"
        return self._bus.publish(self._topic, message.payload)
