"""Delivery of outbox messages to webhooks: signed, retried with backoff, dead-lettered at last."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import threading

import httpx

from climate.db import outbox
from climate.db.tables import OutboxMessage
from climate.domain.clock import seconds_until
from climate.services.context import ServiceContext

LOG = logging.getLogger(__name__)
BATCH = 50
MAX_BACKOFF_SECONDS = 300.0
SIGNATURE_HEADER = "X-Climate-Signature"


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes with the shared secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliverer:
    """Sends due outbox rows. A receiver that is down or slow delays only its own messages."""

    def __init__(self, ctx: ServiceContext, client: httpx.Client | None = None) -> None:
        self.ctx = ctx
        self.client = client or httpx.Client(timeout=ctx.settings.webhook_timeout_seconds)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def deliver_due(self) -> int:
        """Try every due message once; returns how many were attempted."""
        claimed = self._claim()
        for message in claimed:
            self._send(message)
        return len(claimed)

    def _claim(self) -> list[OutboxMessage]:
        now = self.ctx.clock.now()
        # Push the next attempt past the HTTP timeout, so another deliverer leaves these alone.
        hold = dt.timedelta(seconds=self.ctx.settings.webhook_timeout_seconds * 2 + 1)
        with self.ctx.db.transaction() as session:
            rows = list(outbox.due(session, now, BATCH))
            for row in rows:
                row.next_attempt_at = now + hold
        return rows

    def _send(self, message: OutboxMessage) -> None:
        body = json.dumps(message.payload, sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Climate-Event": message.topic,
            "X-Climate-Delivery": str(message.id),
        }
        if self.ctx.settings.webhook_secret:
            headers[SIGNATURE_HEADER] = sign(self.ctx.settings.webhook_secret, body)
        error: str | None = None
        try:
            response = self.client.post(message.url, content=body, headers=headers)
            if response.status_code >= 300:
                error = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self._record(message.id, error)

    def _record(self, message_id: int, error: str | None) -> None:
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            row = session.get(OutboxMessage, message_id)
            if row is None:
                return
            row.attempts += 1
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
        with self.ctx.db.reader() as session:
            due = outbox.next_due(session)
        return seconds_until(due, self.ctx.clock.now(), self.ctx.settings.max_wait_seconds)

    def wake(self) -> None:
        self._wake.set()

    def run_forever(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.deliver_due()
                wait = self.seconds_until_next()
            except Exception:
                LOG.exception("delivery pass failed; retrying in 1 s")
                wait = 1.0
            self._wake.wait(wait)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="climate-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.client.close()
