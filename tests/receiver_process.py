"""A webhook receiver in a process of its own, so that the busy test process (API, manager and
their threads on one GIL) cannot hold its answers back past a sender's timeout: what it measures
is the service's delivery, not the test's scheduling.

Run as ``python -m tests.receiver_process``: it prints its port, then one JSON line per request
(``time.monotonic()`` at arrival, headers, body), and answers 200 at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ReceiverProcess:
    """The same ``url``, ``arrivals`` and ``close()`` as the in-process receiver; arrival times
    come from the system-wide monotonic clock, so they compare with this process's."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, dict[str, str], bytes]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.receiver_process"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}/hook"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at, headers, body = json.loads(line)
            self.arrivals.append((at, headers, body.encode()))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)


def main() -> None:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            at = time.monotonic()
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            with lock:
                sys.stdout.write(json.dumps([at, dict(self.headers), body.decode()]) + "\n")
                sys.stdout.flush()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sys.stdout.write(f"{server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
