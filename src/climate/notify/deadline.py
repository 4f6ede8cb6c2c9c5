"""An httpx client whose requests can be given a deadline for the whole exchange.

httpx's timeouts bound each network operation on its own: a receiver that sends its answer one
byte every second never lets a read time out, and holds the sender for as long as it likes. A
webhook send must end within the time its claim was sized for, so every connect, read and write
of a request made inside ``deadline(seconds)`` waits at most what is left of it, and fails as a
timeout once it has passed.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
import typing
from collections.abc import Iterator

import httpcore
import httpx

_local = threading.local()
WRITE_CHUNK = 65536
"""Bytes written per socket call, so that a receiver reading slowly meets the deadline too."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Requests of this thread's deadline clients made inside end within ``seconds``."""
    previous: float | None = getattr(_local, "deadline", None)
    _local.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = previous


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    end: float | None = getattr(_local, "deadline", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the whole exchange took longer than its deadline")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_CHUNK):
            chunk = buffer[start : start + WRITE_CHUNK]
            self._inner.write(chunk, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        # httpx builds its pool on httpcore's default backend and takes no other: the same pool,
        # on the backend that keeps the deadline.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            keepalive_expiry=httpx.Limits().keepalive_expiry,
            network_backend=_Backend(),
        )


def deadline_client(timeout: float) -> httpx.Client:
    """An ``httpx.Client`` with ``timeout`` on each operation, whose requests keep the
    ``deadline`` they are made in."""
    return httpx.Client(timeout=timeout, transport=_Transport())
