"""Where outbox messages go. A sink is named by the outbox row's ``url`` column; today every sink
is a webhook, and a message bus will be another kind of sink beside it."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import httpx

from climate.addresses import webhook_url_problem
from climate.notify.deadline import deadline

if TYPE_CHECKING:
    from climate.db.tables import OutboxMessage

SIGNATURE_HEADER = "X-Climate-Signature"
DELIVERY_HEADER = "X-Climate-Delivery"
"""The outbox message's id: the same on every attempt, so a receiver drops repeats by it."""


class Sink(Protocol):
    """One destination, with its own queue of outbox messages (the rows with its ``key``)."""

    key: str
    send_seconds: float
    """The longest one ``send`` can take: a claim on this sink's messages holds that long for
    each message claimed."""

    def send(self, message: OutboxMessage) -> str | None:
        """Deliver ``message``: None once the destination has it, else why not. An exception
        counts as a failure of this message too."""
        ...


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes with the shared secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookSink:
    """POSTs the message's payload as JSON to its URL, signed when there is a secret."""

    def __init__(
        self,
        url: str,
        client: httpx.Client,
        secret: str,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.key = url
        # httpx applies the timeout to connecting, writing and reading, each on its own.
        self.send_seconds = 3 * timeout
        self._client = client
        self._secret = secret
        self._problem = webhook_url_problem(url)
        self._headers = dict(headers or {})

    def send(self, message: OutboxMessage) -> str | None:
        if self._problem is not None:
            # Stored before the URL was checked at start-up; it can never be sent.
            return f"not a webhook URL: {self._problem}"
        body = json.dumps(message.payload, sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Climate-Event": message.topic,
            DELIVERY_HEADER: str(message.id),
            **self._headers,
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        with deadline(self.send_seconds):
            response = self._client.post(self.key, content=body, headers=headers)
        return f"HTTP {response.status_code}" if response.status_code >= 300 else None
