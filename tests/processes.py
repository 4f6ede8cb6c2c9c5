"""Climate processes started the way an operator starts them, for multi-process tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.conftest import free_port

CLIMATE = str(Path(sys.executable).with_name("climate"))


class Process:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        full_env = {**os.environ, **(env or {})}
        # A file, not a pipe: nobody reads a pipe while the test runs, and a full one blocks the
        # process at its next log line.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [CLIMATE, *args], env=full_env, stdout=self.log, stderr=subprocess.STDOUT, text=True
        )

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.seek(0)
        output = self.log.read()
        self.log.close()
        return output

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_api(
    database_url: str, command: str = "api", env: dict[str, str] | None = None
) -> tuple[Process, str]:
    return start_serving([command, "--database-url", database_url], env)


BIND_ATTEMPTS = 3


class PortTaken(RuntimeError):
    pass


def start_serving(args: list[str], env: dict[str, str] | None = None) -> tuple[Process, str]:
    """``climate <args> --port <free port>``, once it answers HTTP; the process and its URL.

    A port found free may be taken by a test on another xdist worker before the process binds
    it: the process then exits saying so, and another port is tried."""
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return _start_serving(args, env)
        except PortTaken:
            continue
    return _start_serving(args, env)


def _start_serving(args: list[str], env: dict[str, str] | None) -> tuple[Process, str]:
    port = free_port()
    process = Process([*args, "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            output = process.stop()
            if f"port {port} on 127.0.0.1 is already in use" in output:
                raise PortTaken(output)
            raise RuntimeError(f"climate {args[0]} exited: {output}")
        try:
            if httpx.get(url + "/", timeout=1).status_code == 300:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.stop()
    raise RuntimeError(f"climate {args[0]} did not come up on {url}")


def start_manager(database_url: str, env: dict[str, str] | None = None) -> Process:
    return Process(["manager", "--database-url", database_url], env)
