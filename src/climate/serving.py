"""The HTTP server around the API: one uvicorn configuration from the settings, read timeouts,
and a listening socket bound before anything else starts."""

from __future__ import annotations

import asyncio
import atexit
import errno
import os
import shutil
import socket
import sys
import tempfile
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from climate.config import Settings
from climate.errors import ClimateError

_TIMEOUT_BODY = b"request timed out"
TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class ServerConfig(uvicorn.Config):
    """uvicorn's configuration for the API from the settings: ``climate serve``, each worker of
    ``climate api --workers N`` and the tests' live servers all run this one."""

    def __init__(self, app: Any, settings: Settings, **options: Any) -> None:
        super().__init__(
            app,
            host=settings.bind_host,
            port=settings.port,
            http=ReadTimeoutProtocol,
            ws="none",
            limit_concurrency=settings.max_connections,
            log_level="warning",
            access_log=False,
            **options,
        )
        self.header_timeout = settings.header_timeout_seconds
        self.body_timeout = settings.body_timeout_seconds


class ReadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on reading each request.

    A connection has ``header_timeout`` from its opening (or from the first byte of its next
    request) to send complete headers, then ``body_timeout`` for the body. When a deadline
    passes, the request is answered 408 and the connection closed: a client sending a byte now
    and then holds a socket for seconds, not forever.
    """

    def __init__(self, config: uvicorn.Config, server_state: ServerState, **kwargs: Any) -> None:
        super().__init__(config, server_state, **kwargs)
        assert isinstance(config, ServerConfig)
        self.header_timeout = config.header_timeout
        self.body_timeout = config.body_timeout
        self.read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, reading_body=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.read_deadline is None:
            self._arm(self.header_timeout, reading_body=False)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout, reading_body=True)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def _arm(self, seconds: float, *, reading_body: bool) -> None:
        self._disarm()
        self.read_deadline = self.loop.call_later(seconds, self._read_timed_out, reading_body)

    def _disarm(self) -> None:
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None

    def _read_timed_out(self, reading_body: bool) -> None:
        self.read_deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if reading_body:
            # The application waits for the rest of the body: it gets a disconnect, and whatever
            # it answers is dropped rather than written after the 408.
            answer = not cycle.response_started
            cycle.disconnected = True
            cycle.message_event.set()
        else:
            # The 408 goes out only if no earlier (pipelined) response is still being written.
            answer = cycle is None or cycle.response_complete
        if answer:
            self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def metrics_directory(settings: Settings, workers: int) -> str | None:
    """Where this process and its children keep their Prometheus counters, set in the
    environment before prometheus-client is imported (``climate.metrics``): ``metrics_dir``, or
    for several workers a temporary directory removed at exit, or a directory the operator
    already named in ``PROMETHEUS_MULTIPROC_DIR``. None: counters stay in this process."""
    if os.environ.get(MULTIPROC_ENV):
        return os.environ[MULTIPROC_ENV]
    if settings.metrics_dir:
        path = settings.metrics_dir
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise ClimateError(f"metrics_dir: cannot create {path}: {exc.strerror}") from exc
    elif workers > 1:
        path = tempfile.mkdtemp(prefix="climate-metrics-")
        atexit.register(shutil.rmtree, path, True)
    else:
        return None
    if "prometheus_client" in sys.modules:
        raise ClimateError("metrics_dir: prometheus_client was imported before it could be set")
    os.environ[MULTIPROC_ENV] = path
    return path


def bind(settings: Settings) -> socket.socket:
    """The listening socket for ``bind_host:port``, or an error naming what is in the way.

    Bound before the database is opened, the manager started or anything printed, so that a
    second server on a busy port fails at once and says why."""
    host, port = settings.bind_host, settings.port
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ClimateError(f"cannot listen on {host}: {exc.strerror}") from exc
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ClimateError(f"port {port} on {host} is already in use") from exc
        raise ClimateError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
