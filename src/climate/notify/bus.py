"""Notifications on the message bus, as OpenStack Blazar sends them (oslo.messaging).

Each configured topic is a sink of its own (``bus:<topic>``), fed from the outbox like a webhook.
A row holds the whole oslo.messaging message, rendered when the change was written: its
``message_id`` is fixed then, so a message sent twice (a manager killed after the broker took it)
carries the same id both times and consumers drop the repeat by it.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Literal

from climate import wire
from climate.addresses import BUS_PREFIX, oslo_config, oslo_messaging, redact

if TYPE_CHECKING:
    from climate.db.tables import Event, Lease, OutboxMessage, Reservation

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


class Bus:
    """One oslo.messaging notification transport, shared by every topic's sink.

    It sends through the transport itself rather than an ``oslo_messaging.Notifier``: the
    Notifier (and its drivers) log a failed send and return as if it had worked, and the outbox
    needs to know, to try again. ``retry=0`` makes one attempt to reach the broker; a send that
    hangs (a broker that accepts connections and does not answer) is given up after ``timeout``.
    """

    def __init__(self, url: str, driver: Driver, timeout: float) -> None:
        # Imported here, in the thread that builds the deliverer: imported first in one of its
        # sink threads, eventlet's greenlet state for that thread keeps it from ever exiting.
        self._oslo = oslo_messaging()
        self._url = url
        self._version = 2.0 if driver == "messagingv2" else 1.0
        self._timeout = timeout
        self._transport: Any = None
        self._lock = threading.Lock()
        # One thread: sends are brief, and one that hangs makes the others time out too, as
        # they should (the broker is not answering).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="climate-notify-bus")
        self._abandoned: dict[tuple[str, str], Future[None]] = {}
        """Sends given up after ``timeout`` and still running, by (topic, message_id): the broker
        may take them yet, so no other send starts behind them (it would go out after they
        recover, and a message given up is retried: the broker would get it twice)."""
        self._taken_late: set[tuple[str, str]] = set()
        """Messages whose abandoned send went through after all: their retry is done already."""
        self._books = threading.Lock()

    def _get_transport(self) -> Any:
        with self._lock:
            if self._transport is None:
                self._transport = self._oslo.get_notification_transport(
                    oslo_config(), url=self._url
                )
            return self._transport

    def publish(self, topic: str, stored: Mapping[str, Any]) -> str | None:
        """Send one stored message on ``topic``: None once the broker has it, else why not."""
        body = dict(stored["message"])
        key = (topic, str(body["message_id"]))
        with self._books:
            for done in [k for k, job in self._abandoned.items() if job.done()]:
                job = self._abandoned.pop(done)
                if not job.cancelled() and job.exception() is None:
                    self._taken_late.add(done)
            if key in self._taken_late:
                self._taken_late.discard(key)
                return None
            if self._abandoned:
                return (
                    "the message bus has not finished a send given up after "
                    f"{self._timeout:g} s; no other starts before it ends"
                )
        target = self._oslo.Target(topic=f"{topic}.{body['priority'].lower()}")
        job = self._pool.submit(self._send, target, dict(stored["context"]), body)
        try:
            job.result(timeout=self._timeout)
        except FutureTimeout:
            if not job.cancel():
                with self._books:
                    self._abandoned[key] = job
            return f"the message bus did not take the message within {self._timeout:g} s"
        except Exception as exc:
            return f"{type(exc).__name__}: {redact(str(exc))}"
        return None

    def _send(self, target: Any, context: dict[str, Any], body: dict[str, Any]) -> None:
        self._get_transport()._send_notification(
            target, context, body, version=self._version, retry=0
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._transport is not None:
                self._transport.cleanup()
                self._transport = None


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
