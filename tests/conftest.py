"""Fixtures: real SQLite and PostgreSQL databases, a manual clock, services, a live HTTP server."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn
from sqlalchemy import text

from climate.api.app import create_app
from climate.config import Settings, load_settings
from climate.db import migrate
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock, SystemClock
from climate.runtime import Workers, build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.serving import ServerConfig
from tests.openstack.conftest import ON_THE_RIG

PG_ADMIN_URL = os.environ.get("CLIMATE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
TABLES = (
    "allocation_changes, host_allocations, assignments, outbox, events, reservations, leases, "
    "host_properties, "
    "hosts, resource_properties, api_tokens, audit_log, item_allocations, item_properties, items, "
    "volume_allocations, volume_pool_properties, volume_pools, instance_allocations, lease_series, "
    "managers, refused_demand, credit_balances, credit_ledger"
)

ADMIN = Actor("admin-user", "admin-project", frozenset({"admin"}))
ALICE = Actor("alice", "project-a", frozenset({"member"}))
BOB = Actor("bob", "project-b", frozenset({"member"}))


# Tests run in parallel (pytest-xdist, ``--dist loadgroup``). Those sharing one outside thing that
# a second process would disturb run on one worker, in the order collected: Blazar 18's launcher
# (which builds its own venv on first use) and the machine's RabbitMQ exchanges the bus tests
# bind to. The OpenStack rig's tests are marked ``rig`` and run apart (``make test``).
_MARKS_BY_PATH = {
    "tests/openstack/": ON_THE_RIG,
    "tests/test_blazar_differential.py": (pytest.mark.xdist_group("blazar-18"),),
    "tests/test_blazar_import.py": (pytest.mark.xdist_group("blazar-18"),),
    "tests/test_bus_notifications.py": (pytest.mark.xdist_group("rabbitmq"),),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for prefix, marks in _MARKS_BY_PATH.items():
            if path.startswith(prefix):
                for mark in marks:
                    item.add_marker(mark)


def _pg_reachable() -> str | None:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A throwaway PostgreSQL database for this test run, migrated to head, dropped at the end."""
    problem = _pg_reachable()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but PostgreSQL is not reachable at {PG_ADMIN_URL}: {problem}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}; skipping PostgreSQL tests")
    name = f"climate_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file; each test gets a copy (migrating per test would be slow)."""
    path = tmp_path_factory.mktemp("template") / "climate.db"
    db = Database(f"sqlite:///{path}")
    migrate.upgrade(db)
    db.dispose()
    return path


def _sqlite_copy(template: Path, directory: Path) -> str:
    target = directory / "climate.db"
    shutil.copy(template, target)
    return f"sqlite:///{target}"


def _reset_pg(url: str) -> None:
    db = Database(url)
    with db.transaction() as session:
        session.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    db.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, sqlite_template: Path, tmp_path: Path) -> str:
    """Each test using this runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return _sqlite_copy(sqlite_template, tmp_path)
    url: str = request.getfixturevalue("pg_url")
    _reset_pg(url)
    return url


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    return _sqlite_copy(sqlite_template, tmp_path)


@pytest.fixture
def settings() -> Settings:
    return load_settings(env={}, minutes_before_end_lease=60, event_retry_base_seconds=0.0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def ctx(settings: Settings, db: Database, clock: ManualClock) -> ServiceContext:
    return build_context(settings, db, clock)


@pytest.fixture
def leases(ctx: ServiceContext) -> LeaseService:
    return LeaseService(ctx)


@pytest.fixture
def hosts(ctx: ServiceContext) -> HostService:
    return HostService(ctx)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LiveServer:
    """A real uvicorn server on loopback with the manager running, in this process."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        # Bound here and handed to uvicorn: a port found free and bound later may be taken
        # meanwhile by a test on another xdist worker.
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port: int = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers: Workers = build_workers(ctx)
        here = ctx.settings.model_copy(update={"bind_host": "127.0.0.1", "port": self.port})
        self.server = uvicorn.Server(ServerConfig(create_app(ctx), here))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.workers.start(watch=False)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()
        self.workers.stop()


@contextlib.contextmanager
def serve(settings: Settings, url: str) -> Iterator[LiveServer]:
    """A live server on the real clock with these settings, on the database at ``url``."""
    database = Database(url)
    try:
        with LiveServer(build_context(settings, database, SystemClock())) as server:
            yield server
    finally:
        database.dispose()


@pytest.fixture
def live(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    """A live server on the real clock, over SQLite and PostgreSQL."""
    with serve(settings, database_url) as server:
        yield server


@pytest.fixture
def live_sqlite(settings: Settings, sqlite_url: str) -> Iterator[LiveServer]:
    with serve(settings, sqlite_url) as server:
        yield server


@pytest.fixture
def api(live_sqlite: LiveServer) -> Iterator[httpx.Client]:
    """An HTTP client of ``live_sqlite``, outside any proxy the environment names."""
    with httpx.Client(base_url=live_sqlite.url, timeout=10, trust_env=False) as client:
        yield client
