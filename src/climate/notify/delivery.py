"""Delivery of outbox messages: every sink drains its own queue, retried with backoff,
dead-lettered at last.

Delivery is at least once. A message is marked delivered only after its sink accepted it, so a
manager that dies between the two, or whose claim ran out while it was still sending, leaves the
message to be sent again; receivers drop repeats by the ``X-Climate-Delivery`` id.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import httpx

from climate import metrics
from climate.addresses import BUS_PREFIX
from climate.context import ServiceContext
from climate.db import outbox
from climate.db.tables import OutboxMessage
from climate.domain.clock import seconds_until
from climate.fairshare import external
from climate.notify.bus import Bus, BusSink
from climate.notify.deadline import deadline_client
from climate.notify.sinks import Sink, WebhookSink

LOG = logging.getLogger(__name__)
SINK_BATCH = 10
"""Messages one sink claims at a time; its claim holds for all of them."""
CLAIM_MARGIN_SECONDS = 5.0
"""Added to a claim beyond its messages' sending time: database round trips, name lookups."""
MAX_BACKOFF_SECONDS = 300.0
MAX_PAUSE_SECONDS = 8.0
"""The longest pause of the deliverer after jobs failed in a row (the database unable to
write: a full disk, read-only)."""


class Deliverer:
    """Sends due outbox messages, one sink's messages one after another, sinks side by side.

    Each pass finds the sinks with due messages and gives every one that this process is not
    already serving a job on a pool of ``webhook_concurrency`` threads: claim a batch of its due
    messages, send them in order, record each outcome on its own message. A sink that is down,
    slow or malformed holds up only its own queue; a failure of any kind is that message's
    attempt, retried with backoff and dead-lettered after ``webhook_max_attempts``, and ends the
    job (the rest of the batch goes back), so a failing sink takes a thread for one message at a
    time.
    """

    def __init__(self, ctx: ServiceContext, client: httpx.Client | None = None) -> None:
        self.ctx = ctx
        self.client = client or deadline_client(ctx.settings.webhook_timeout_seconds)
        self._pool = ThreadPoolExecutor(
            ctx.settings.webhook_concurrency, thread_name_prefix="climate-notify-sink"
        )
        self._bus: Bus | None = None
        if ctx.settings.notification_transport_url:
            self._bus = Bus(
                ctx.settings.notification_transport_url,
                ctx.settings.notification_driver,
                ctx.settings.notification_timeout_seconds,
            )
        self._busy: set[str] = set()
        """The sinks this process is serving now."""
        self._orphans: list[tuple[list[int], dt.datetime]] = []
        """Claims of jobs that failed midway (the database connection lost): (message ids,
        claim), handed back by the next pass rather than left until the claim runs out."""
        self._failures = 0
        """Jobs failed in a row (by an exception: the database, not the sink)."""
        self._resume_at = 0.0
        """``time.monotonic()`` before which no pass starts, after a failed job."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def deliver_due(self) -> int:
        """One job for every sink with due messages, side by side (a batch, cut short by a
        failed attempt); returns how many messages were attempted."""
        return sum(job.result() for job in self._dispatch())

    def _dispatch(self) -> list[Future[int]]:
        with self.ctx.db.reader() as session:
            keys = outbox.due_sinks(session, self.ctx.clock.now())
        jobs = []
        for key in keys:
            with self._lock:
                if key in self._busy:
                    continue
                self._busy.add(key)
            jobs.append(self._pool.submit(self._serve, self._sink(key)))
        return jobs

    def _sink(self, key: str) -> Sink:
        settings = self.ctx.settings
        if key.startswith(BUS_PREFIX):
            return BusSink(key, self._bus, settings.notification_timeout_seconds)
        if key == external.endpoint(settings, "on-end"):
            # The external service's on-end: its token, no webhook signature.
            return WebhookSink(
                key,
                self.client,
                "",
                settings.external_service_timeout_seconds,
                external.headers(settings),
            )
        return WebhookSink(
            key, self.client, settings.webhook_secret, settings.webhook_timeout_seconds
        )

    def _serve(self, sink: Sink) -> int:
        try:
            sent = self._deliver_batch(sink)
        except Exception as exc:
            with self._lock:
                # The next pass waits: it would fail the same way at once (the database unable
                # to write), and a pass woken by each failed job spun, logging as fast as it ran.
                self._failures += 1
                pause = min(2.0 ** (self._failures - 1), MAX_PAUSE_SECONDS)
                self._resume_at = time.monotonic() + pause
            if (problem := self.ctx.db.storage_problem(exc)) is not None:
                LOG.error(
                    "delivery to %s failed: %s; its messages wait, next pass in %.0f s",
                    sink.key,
                    problem,
                    pause,
                )
            else:
                LOG.exception(
                    "delivery to %s failed; its claimed messages are handed back at the next "
                    "pass, in %.0f s",
                    sink.key,
                    pause,
                )
            return 0
        else:
            with self._lock:
                self._failures = 0
            return sent
        finally:
            with self._lock:
                self._busy.discard(sink.key)
            self._wake.set()

    def _deliver_batch(self, sink: Sink) -> int:
        batch, claim = self._claim(sink)
        try:
            return self._send_batch(sink, batch, claim)
        except Exception:
            with self._lock:
                self._orphans.append(([m.id for m in batch], claim))
            raise

    def _release_orphans(self) -> None:
        """Hand back the claims of failed jobs: their messages not recorded are due again (one
        sent and not recorded is sent again, as when a manager dies between the two)."""
        with self._lock:
            orphans, self._orphans = self._orphans, []
        for index, (ids, claim) in enumerate(orphans):
            try:
                with self.ctx.db.transaction() as session:
                    outbox.unflushed(session)
                    outbox.release(session, ids, claim, self.ctx.clock.now())
            except Exception:
                with self._lock:
                    self._orphans.extend(orphans[index:])
                raise

    def _send_batch(self, sink: Sink, batch: Sequence[OutboxMessage], claim: dt.datetime) -> int:
        one_send = dt.timedelta(seconds=sink.send_seconds)
        for index, message in enumerate(batch):
            if self._stop.is_set() or self.ctx.clock.now() + one_send > claim:
                # Stopping, or sends took longer than they can: let another manager have the rest.
                self._release(batch[index:], claim)
                return index
            try:
                error = sink.send(message)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            self._record(message.id, claim, error)
            if error is not None and index + 1 < len(batch):
                # A failing sink may fail slowly: give the thread to the sinks queued behind it.
                self._release(batch[index + 1 :], claim)
                return index + 1
        return len(batch)

    def _claim(self, sink: Sink) -> tuple[Sequence[OutboxMessage], dt.datetime]:
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            outbox.unflushed(session)
            rows = outbox.due(session, sink.key, now, SINK_BATCH)
            claim = now + dt.timedelta(seconds=len(rows) * sink.send_seconds + CLAIM_MARGIN_SECONDS)
            for row in rows:
                row.next_attempt_at = claim
        return rows, claim

    def _release(self, messages: Sequence[OutboxMessage], claim: dt.datetime) -> None:
        with self.ctx.db.transaction() as session:
            outbox.unflushed(session)
            outbox.release(session, [m.id for m in messages], claim, self.ctx.clock.now())

    def _record(self, message_id: int, claim: dt.datetime, error: str | None) -> None:
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            outbox.unflushed(session)
            row = session.get(OutboxMessage, message_id)
            if row is None or row.status != outbox.PENDING or row.next_attempt_at != claim:
                LOG.warning(
                    "notification %s: its claim ran out while it was sent; another manager has it",
                    message_id,
                )
                return
            row.attempts += 1
            sink = "bus" if row.url.startswith(BUS_PREFIX) else "webhook"
            (metrics.DELIVERIES if error is None else metrics.DELIVERY_FAILURES).labels(sink).inc()
            if error is None:
                row.status, row.delivered_at, row.last_error = outbox.DELIVERED, now, None
                return
            row.last_error = error
            if row.attempts >= self.ctx.settings.webhook_max_attempts:
                row.status = outbox.DEAD
                LOG.error(
                    "notification %s (%s) to %s dead after %d attempts: %s",
                    row.id,
                    row.topic,
                    row.url,
                    row.attempts,
                    error,
                )
            else:
                delay = min(2.0 ** (row.attempts - 1), MAX_BACKOFF_SECONDS)
                row.next_attempt_at = now + dt.timedelta(seconds=delay)
                LOG.warning(
                    "notification %s (%s) to %s failed, retry in %.0f s: %s",
                    row.id,
                    row.topic,
                    row.url,
                    delay,
                    error,
                )

    def seconds_until_next(self) -> float:
        """Until the next message is due at a sink this process is not serving (a job that ends
        wakes the loop anyway)."""
        with self._lock:
            busy = set(self._busy)
        with self.ctx.db.reader() as session:
            due = outbox.next_due(session, busy)
        return seconds_until(due, self.ctx.clock.now(), self.ctx.settings.max_wait_seconds)

    def wake(self) -> None:
        self._wake.set()

    def run_forever(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                pause = self._resume_at - time.monotonic()
            if pause > 0 and self._stop.wait(pause):
                break
            self._wake.clear()
            try:
                self._release_orphans()
                self._dispatch()
                wait = self.seconds_until_next()
            except Exception as exc:
                wait = 1.0
                if (problem := self.ctx.db.storage_problem(exc)) is not None:
                    LOG.error("delivery pass failed: %s; retrying in 1 s", problem)
                else:
                    LOG.exception("delivery pass failed; retrying in 1 s")
            self._wake.wait(wait)

    def start(self) -> None:
        # Messages written by this process (the manager's, the API's) wake the loop at commit.
        self.ctx.db.outbox_listeners.append(self.wake)
        self._thread = threading.Thread(target=self.run_forever, name="climate-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop dispatching, let each sink finish the message it is sending and hand back the
        rest of its claim."""
        self._stop.set()
        self._wake.set()
        with contextlib.suppress(ValueError):
            self.ctx.db.outbox_listeners.remove(self.wake)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
        if self._bus is not None:
            self._bus.close()
