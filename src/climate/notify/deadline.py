"""An httpx client whose requests can be given a deadline for the whole exchange.

httpx's timeouts bound each network operation on its own: a receiver that sends its answer one
byte every second never lets a read time out, and holds the sender for as long as it likes. A
webhook send must end within the time its claim was sized for, so every connect, read and write
of a request made inside ``deadline(seconds)`` waits at most what is left of it, and fails as a
timeout once it has passed. That includes looking the host name up (``getaddrinfo`` knows no
timeout: a DNS server that does not answer holds it for the resolver's own timeouts), and the
connection to an HTTP proxy named by ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` (with
``NO_PROXY``), honoured as by any httpx client.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import threading
import time
import typing
from collections.abc import Iterator

import httpcore
import httpx
from httpx._utils import get_environment_proxies

from climate.addresses import redact

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
        addresses = _resolve(host, port, _left(timeout, httpcore.ConnectTimeout))
        error: Exception = httpcore.ConnectError(f"{host} has no address")
        for address in addresses:
            left = _left(timeout, httpcore.ConnectTimeout)
            try:
                inner = self._inner.connect_tcp(address, port, left, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
                continue
            return _Stream(inner)
        raise error

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


def _resolve(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses of ``host``, looked up in a thread of its own that is left to finish alone
    (nothing can interrupt ``getaddrinfo``) if the answer takes longer than ``timeout``."""
    with contextlib.suppress(ValueError):
        return [str(ipaddress.ip_address(host.strip("[]")))]
    found: list[list[str] | Exception] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found.append(list(dict.fromkeys(str(info[4][0]) for info in infos)))
        except OSError as exc:
            found.append(exc)
        done.set()

    threading.Thread(target=look_up, name="climate-notify-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise httpcore.ConnectTimeout(f"looking up {host} took longer than its deadline")
    (result,) = found
    if isinstance(result, Exception):
        raise httpcore.ConnectError(f"looking up {host}: {result}")
    return result


def _pool(proxy: httpx.Proxy | None) -> httpcore.ConnectionPool:
    """httpx's pool for ``proxy`` (none, or an HTTP(S) proxy), on the backend that keeps the
    deadline: httpx builds its pools on httpcore's default backend and takes no other."""
    ssl_context = httpx.create_ssl_context()
    keepalive_expiry = httpx.Limits().keepalive_expiry
    if proxy is None:
        return httpcore.ConnectionPool(
            ssl_context=ssl_context, keepalive_expiry=keepalive_expiry, network_backend=_Backend()
        )
    return httpcore.HTTPProxy(
        proxy_url=httpcore.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        ),
        proxy_auth=proxy.raw_auth,
        proxy_headers=proxy.headers.raw,
        ssl_context=ssl_context,
        proxy_ssl_context=proxy.ssl_context,
        keepalive_expiry=keepalive_expiry,
        network_backend=_Backend(),
    )


class _Transport(httpx.HTTPTransport):
    def __init__(self, proxy: httpx.Proxy | None = None) -> None:
        super().__init__()
        self._pool = _pool(proxy)


class _Unsupported(httpx.BaseTransport):
    """A proxy of another kind (SOCKS): each request through it fails, saying so."""

    def __init__(self, url: str) -> None:
        self._why = f"webhooks go through http:// and https:// proxies only, not {url!r}"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ProxyError(self._why, request=request)


def _proxy_transport(url: str) -> httpx.BaseTransport:
    proxy = httpx.Proxy(url)
    if proxy.url.scheme not in ("http", "https"):
        return _Unsupported(redact(url))
    return _Transport(proxy)


def deadline_client(timeout: float) -> httpx.Client:
    """An ``httpx.Client`` with ``timeout`` on each operation, whose requests keep the
    ``deadline`` they are made in, through the proxies the environment names."""
    # httpx reads the proxy variables only for a client without a transport of its own.
    mounts: dict[str, httpx.BaseTransport | None] = {
        pattern: None if url is None else _proxy_transport(url)
        for pattern, url in get_environment_proxies().items()
    }
    return httpx.Client(timeout=timeout, transport=_Transport(), mounts=mounts)
