"""A real ``climate serve`` subprocess on a free loopback port, on a throwaway database."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
BASELINE_SRC = "BENCH_SERVER_SRC"
"""An older checkout's ``src`` to run the servers from (the benchmark's own code stays this
checkout's): ``BENCH_SERVER_SRC=/tmp/old/src python -m bench ...`` measures a baseline."""


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    pid: int
    dialect: str
    database_url: str
    """The URL handed to ``climate serve`` (SQLite: the file the server creates)."""
    sqlite_path: Path | None
    log_path: Path


def climate_executable() -> str:
    """The ``climate`` script of the interpreter running the benchmark, else the one on PATH."""
    beside = Path(sys.executable).parent / "climate"
    if beside.exists():
        return str(beside)
    found = shutil.which("climate")
    if found is None:
        raise SystemExit("cannot find the 'climate' command; install the project in this venv")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database; dropped (with FORCE) afterwards."""
    name = f"climate_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[str]:
    """The ``src`` of commit ``rev`` of this repository, in a detached worktree removed on
    leaving: what ``climate_server(server_src=...)`` runs to measure a baseline in the same run.
    It runs on this checkout's environment, so ``rev`` must need no other dependencies."""
    where = Path(tempfile.mkdtemp(prefix="climate-baseline-")) / "tree"
    added = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent), "worktree", "add", "--detach"]
        + ["-q", str(where), rev],
        capture_output=True,
        text=True,
    )
    if added.returncode != 0:
        shutil.rmtree(where.parent, ignore_errors=True)
        raise RuntimeError(f"cannot check out {rev}: {added.stderr.strip()}")
    try:
        yield str(where / "src")
    finally:
        subprocess.run(
            ["git", "-C", str(where), "worktree", "remove", "--force", str(where)],
            capture_output=True,
        )
        shutil.rmtree(where.parent, ignore_errors=True)


def _server_env(data_dir: Path, server_src: str | None) -> dict[str, str]:
    # Defaults only: no operator config or CLIMATE_* variable of the caller leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIMATE_")}
    env["CLIMATE_DATA_DIR"] = str(data_dir)
    env["CLIMATE_AUTH"] = "noauth"
    baseline = server_src or os.environ.get(BASELINE_SRC)
    if baseline:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline, env.get("PYTHONPATH")]))
    return env


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_ready(proc: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"climate serve exited with {proc.returncode}:\n{_log_tail(log_path)}"
                )
            try:
                if client.get(f"{base_url}/versions").status_code == 300:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError(
        f"climate serve not ready after {READY_TIMEOUT:.0f} s:\n{_log_tail(log_path)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT)


def _migrate(database_url: str) -> None:
    from climate.db import migrate
    from climate.db.engine import Database

    db = Database(database_url)
    migrate.upgrade(db)
    db.dispose()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def family(pid: int) -> Iterator[tuple[Path, list[str]]]:
    """``/proc`` entries of ``pid`` and its child processes, each with its ``stat`` fields after
    the command name (state, ppid, ..., utime as the 12th, stime the 13th)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            yield entry, fields


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its child processes (all their threads)."""
    return sum(int(f[11]) + int(f[12]) for _, f in family(pid)) / CLOCK_TICKS


def written_bytes(pid: int) -> int:
    """Bytes ``pid`` and its child processes sent to storage (``write_bytes`` of /proc/pid/io:
    the database file and its WAL, checkpoints included)."""
    total = 0
    for entry, _ in family(pid):
        with contextlib.suppress(OSError):
            for line in (entry / "io").read_text().splitlines():
                if line.startswith("write_bytes:"):
                    total += int(line.split()[1])
    return total


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """Resident memory of ``pid`` and its child processes in MB (``VmHWM``: each one's peak,
    summed); None once it is gone."""
    total, found = 0, False
    for entry, _ in family(pid):
        with contextlib.suppress(OSError):
            for line in (entry / "status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
                    found = True
    return total / 1024.0 if found else None


@contextlib.contextmanager
def climate_server(
    db: str,
    *,
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL,
    keep: bool = False,
    prepare: Callable[[str], None] | None = None,
    api_workers: int = 0,
    serve_workers: int = 1,
    extra_env: Mapping[str, str] | None = None,
    server_src: str | None = None,
) -> Iterator[RunningServer]:
    """Start ``climate serve`` (API + manager) on a fresh database; stop it and clean up after.

    ``db`` is ``sqlite`` (a file in a fresh temporary data dir) or ``postgresql`` (a fresh
    database on the server behind ``pg_admin_url``). With ``keep`` the temporary dir survives.
    ``prepare`` gets the database URL before the server starts (to seed it). With
    ``api_workers`` N > 0 it starts ``climate api --workers N`` instead: N API processes and no
    manager, on a database migrated beforehand; with ``serve_workers`` N > 1, ``climate serve
    --workers N``: N API processes and the manager. ``extra_env`` is added to the server's
    environment (settings as ``CLIMATE_*`` variables, a cloud's ``OS_*``). ``server_src``, an
    older checkout's ``src`` (``checkout``), runs that code instead of this checkout's.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="climate-bench-"))
    log_path = data_dir / "server.log"
    try:
        with contextlib.ExitStack() as stack:
            port = free_port()
            args = [climate_executable(), "serve", "--port", str(port)]
            if serve_workers > 1:
                args += ["--workers", str(serve_workers)]
            if api_workers:
                args = [climate_executable(), "api", "--port", str(port)]
                args += ["--workers", str(api_workers)]
            sqlite_path: Path | None = None
            if db == "postgresql":
                database_url = stack.enter_context(pg_database(pg_admin_url))
                args += ["--database-url", database_url]
            else:
                sqlite_path = data_dir / "climate.db"
                database_url = f"sqlite:///{sqlite_path}"
            if prepare is not None:
                prepare(database_url)  # the server migrates further if it has to
            if api_workers:
                _migrate(database_url)
            log = stack.enter_context(log_path.open("wb"))
            proc = subprocess.Popen(
                args,
                env={**_server_env(data_dir, server_src), **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            stack.callback(_stop, proc)
            base_url = f"http://127.0.0.1:{port}"
            _wait_ready(proc, base_url, log_path)
            yield RunningServer(base_url, proc.pid, db, database_url, sqlite_path, log_path)
    finally:
        if keep:
            print(f"  (kept {data_dir})")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
