"""``climate serve`` as an operator runs it: read timeouts against slow clients, the connection cap,
a busy port, and settings errors."""

from __future__ import annotations

import selectors
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.processes import CLIMATE, Process, start_serving

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0


def _serve(data_dir: Path, **env: str) -> tuple[Process, str]:
    return start_serving(["serve"], {"CLIMATE_DATA_DIR": str(data_dir), **env})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    process, url = _serve(
        tmp_path,
        CLIMATE_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        CLIMATE_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
    )
    try:
        yield url
    finally:
        process.stop()


def _open(url: str, first_bytes: bytes) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(first_bytes)
    sock.setblocking(False)
    return sock


def _closed_after(
    sockets: dict[socket.socket, float], trickle: set[socket.socket], limit: float
) -> tuple[dict[socket.socket, float], dict[socket.socket, bytes]]:
    """Wait until the server has answered and closed each socket; how long each took from its
    opening, and what it was sent. Sockets in ``trickle`` send one more header byte every 0.5 s,
    as a slowloris does to outlast an idle timeout."""
    answers: dict[socket.socket, bytes] = dict.fromkeys(sockets, b"")
    took: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + limit
        next_trickle = time.monotonic() + 0.5
        while len(took) < len(sockets) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(4096)
                except ConnectionResetError:
                    chunk = b""
                answers[sock] += chunk
                if not chunk:
                    took[sock] = time.monotonic() - sockets[sock]
                    selector.unregister(sock)
            if time.monotonic() >= next_trickle:
                next_trickle += 0.5
                for sock in trickle - took.keys():
                    try:
                        sock.send(b"a")
                    except OSError:
                        pass
    return took, answers


def test_slow_clients_are_cut_off_while_normal_requests_stay_fast(server: str) -> None:
    """A few hundred sockets sending partial headers (some trickling a byte at a time) or a
    partial body hold nothing for long: each is answered 408 and closed once its read deadline
    passes, and normal requests meanwhile are served at once."""
    opened: dict[socket.socket, float] = {}
    trickle: set[socket.socket] = set()
    for i in range(300):
        if i % 3 == 2:
            first = (
                b"POST /v1/leases HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b'content-length: 1000\r\n\r\n{"na'
            )
        else:
            first = b"GET /v1/leases HTTP/1.1\r\nHost: x\r\nX-Pad: "
        sock = _open(server, first)
        opened[sock] = time.monotonic()
        if i % 3 == 1:
            trickle.add(sock)
    try:
        with httpx.Client(base_url=server, timeout=10) as http:
            took = []
            for _ in range(20):
                began = time.monotonic()
                assert http.get("/v1/leases").status_code == 200
                took.append(time.monotonic() - began)
        assert statistics.median(took) < 0.5, took

        closed, answers = _closed_after(opened, trickle, limit=HEADER_TIMEOUT + 15)
        assert len(closed) == len(opened), f"{len(opened) - len(closed)} slow sockets still open"
        # Closed because the deadline passed, not at once (1 s of slack for the server's clock).
        assert min(closed.values()) > min(HEADER_TIMEOUT, BODY_TIMEOUT) - 1
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers.values())
    finally:
        for sock in opened:
            sock.close()


def test_connections_beyond_the_cap_get_503_until_some_close(tmp_path: Path) -> None:
    process, url = _serve(
        tmp_path, CLIMATE_MAX_CONNECTIONS="20", CLIMATE_HEADER_TIMEOUT_SECONDS="1"
    )
    try:
        idle = [_open(url, b"") for _ in range(20)]
        time.sleep(0.3)
        # A fresh connection each time: a kept-alive one would count against the cap itself.
        assert httpx.get(url + "/v1/leases", timeout=5).status_code == 503
        for sock in idle:
            sock.close()
        time.sleep(0.3)
        assert httpx.get(url + "/v1/leases", timeout=5).status_code == 200
    finally:
        process.stop()


def test_a_busy_port_fails_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [CLIMATE, "serve", "--port", str(port)],
            env={"CLIMATE_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert f"error: port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "listening" not in done.stdout + done.stderr
    assert "manager" not in done.stdout + done.stderr
    assert not (tmp_path / "climate.db").exists()  # nor was the database touched


def test_a_bad_setting_stops_the_server_naming_the_variable(tmp_path: Path) -> None:
    done = subprocess.run(
        [CLIMATE, "serve"],
        env={"CLIMATE_DATA_DIR": str(tmp_path), "CLIMATE_PORT": "abc", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip() == "error: CLIMATE_PORT: must be an integer, not 'abc'"
