"""Where notifications go, checked: webhook URLs and the message bus's transport URL and topics
(the settings validate them; ``climate.notify`` sends to them)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from functools import cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from climate.errors import InvalidInput

BUS_PREFIX = "bus:"


def sink_keys(topics: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(BUS_PREFIX + topic for topic in topics)


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot receive webhooks, or None: it must be http or https with a host."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it contains spaces or control characters"
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except httpx.InvalidURL as exc:
        return str(exc)
    if parsed.scheme not in ("http", "https"):
        return "only http:// and https:// URLs can receive webhooks"
    if not parsed.host:
        return "it has no host"
    if port is not None and not 0 < port < 65536:
        return f"port {port} is out of range"
    return None


def validate_webhook_urls(urls: Iterable[str]) -> None:
    """:raises InvalidInput: on the ``webhooks`` setting, naming every bad URL and why."""
    problems = [
        f"{url!r}: {problem}" for url in urls if (problem := webhook_url_problem(url)) is not None
    ]
    if problems:
        raise InvalidInput(
            "webhooks", "not a webhook URL (http[s]://host[:port]/path): " + "; ".join(problems)
        )


@cache
def oslo_messaging() -> Any:
    """oslo.messaging, imported on first use (it pulls in eventlet, which warns on import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import oslo_messaging
    return oslo_messaging


def oslo_config() -> Any:
    from oslo_config import cfg

    conf = cfg.ConfigOpts()
    conf([], project="climate", default_config_files=[], default_config_dirs=[])
    return conf


def redact(url: str) -> str:
    """``url`` with its passwords replaced by ``***``, to show in errors and logs."""
    parts = urlsplit(url)
    hosts = []
    for host in parts.netloc.split(","):
        user, at, address = host.rpartition("@")
        if at and ":" in user:
            user = user.split(":", 1)[0] + ":***"
        hosts.append(f"{user}{at}{address}")
    return urlunsplit(parts._replace(netloc=",".join(hosts)))


def transport_url_problem(url: str) -> str | None:
    """Why oslo.messaging cannot use ``url`` as a transport, or None."""
    from importlib.metadata import entry_points

    if any(c.isspace() or not c.isprintable() for c in url):
        return "it contains spaces or control characters"
    oslo = oslo_messaging()
    try:
        parsed = oslo.TransportURL.parse(oslo_config(), url)
    except (oslo.InvalidTransportURL, ValueError) as exc:
        return str(exc)
    drivers = sorted({e.name for e in entry_points(group="oslo.messaging.drivers")} - {"fake"})
    if parsed.transport not in drivers:
        return f"unknown transport {parsed.transport!r}; one of {', '.join(drivers)}"
    if not parsed.hosts or not all(host.hostname for host in parsed.hosts):
        return "it has no host"
    for host in parsed.hosts:
        if host.port is not None and not 0 < host.port < 65536:
            return f"port {host.port} is out of range"
    return None
