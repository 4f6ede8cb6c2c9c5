"""The database failing under a request, for real: a PostgreSQL backend terminated while it
serves one. The request gets a 503 saying the database is unavailable (not a 500, not a hang),
nothing half-made is left, and the next requests are served as usual."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import SystemClock
from climate.notify.delivery import Deliverer
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, LiveServer, _reset_pg, _sqlite_copy, free_port, serve
from tests.helpers import add_hosts, host_request
from tests.test_api_errors import assert_error, client
from tests.test_notifications import Receiver


@pytest.fixture
def live_pg(settings: Settings, pg_url: str) -> Iterator[tuple[LiveServer, str]]:
    _reset_pg(pg_url)
    with serve(settings, pg_url) as server:
        yield server, pg_url


def _lease(name: str, days: int) -> dict[str, object]:
    start = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    return {
        "name": name,
        "start_date": start.strftime("%Y-%m-%d %H:%M"),
        "end_date": (start + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
    }


HOUR = dt.timedelta(hours=1)


def _lease_from_now(name: str, seconds: int) -> dict[str, object]:
    start = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return {
        "name": name,
        "start_date": start.strftime("%Y-%m-%d %H:%M:%S"),
        "end_date": (start + HOUR).strftime("%Y-%m-%d %H:%M:%S"),
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
    }


def _terminate_the_waiting_backend(
    admin: psycopg.Connection, database: str, besides: Collection[int] = ()
) -> int:
    """The pid of the server's backend that waits on the test's lock, once terminated."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
            " AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
        if row is not None and row[0] not in besides:
            admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            return int(row[0])
        time.sleep(0.02)
    raise AssertionError("no backend of the server waited on the lock")


def test_a_backend_terminated_mid_request_is_a_503_and_the_next_requests_are_served(
    live_pg: tuple[LiveServer, str],
) -> None:
    server, url = live_pg
    database = url.rsplit("/", 1)[1]
    with client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as admin:
            # The server's insert of the lease waits on this lock, inside its transaction.
            locker.execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            answers: list[httpx.Response] = []
            sending = threading.Thread(
                target=lambda: answers.append(http.post("/v1/leases", json=_lease("cut", 1)))
            )
            began = time.monotonic()
            sending.start()
            _terminate_the_waiting_backend(admin, database)
            locker.rollback()
            sending.join(20)
        assert answers, "the request hung"
        assert time.monotonic() - began < 10
        (cut,) = answers
        assert_error(cut, 503, "database unavailable")
        assert cut.headers["retry-after"] == "1"
        listed = http.get("/v1/leases")
        assert listed.status_code == 200
        assert [lease["name"] for lease in listed.json()["leases"]] == []
        created = http.post("/v1/leases", json=_lease("after", 2))
        assert created.status_code == 201, created.text
        assert http.get("/v1/leases").json()["leases"][0]["name"] == "after"


def test_a_manager_whose_connection_is_cut_while_it_starts_a_lease_starts_it_at_the_next_pass(
    live_pg: tuple[LiveServer, str],
) -> None:
    """The manager's backend terminated while it starts a lease (waiting, inside the start's
    transaction, on a lock on the standalone backend's assignments): the pass fails and the
    start event stayed claimed by this live manager, which nobody takes over, for
    ``event_claim_seconds`` (120 s): the lease stayed PENDING two minutes past its start."""
    server, url = live_pg
    database = url.rsplit("/", 1)[1]
    with client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        now = dt.datetime.now(dt.UTC)
        body = {
            "name": "soon",
            "start_date": (now + dt.timedelta(seconds=2)).strftime("%Y-%m-%d %H:%M:%S"),
            "end_date": (now + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S"),
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        }
        created = http.post("/v1/leases", json=body)
        assert created.status_code == 201, created.text
        path = f"/v1/leases/{created.json()['lease']['id']}"
        with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as admin:
            locker.execute("LOCK TABLE assignments IN ACCESS EXCLUSIVE MODE")
            # The planned start (one transaction: claim and work), then, a second later, the
            # claimed one (the claim committed first, the work waiting on the lock).
            first = _terminate_the_waiting_backend(admin, database)
            second = _terminate_the_waiting_backend(admin, database, besides={first})
            assert first != second
            locker.rollback()
        cut = time.monotonic()
        status = ""
        while time.monotonic() < cut + 10:
            status = http.get(path).json()["lease"]["status"]
            if status == "ACTIVE":
                break
            time.sleep(0.1)
        assert status == "ACTIVE", status
        assert time.monotonic() - cut < 5


def test_a_deliverer_whose_connection_is_cut_while_it_records_a_send_sends_it_again_at_once(
    settings: Settings, pg_url: str
) -> None:
    """The deliverer's backend terminated while it records a webhook's answer (waiting on a
    lock on the message's row): the job failed and its claim was left to run out (here 35 s:
    3 x the 10 s timeout + 5 s), the message unsent meanwhile. It is handed back at the next
    pass and sent again (a repeat, as at-least-once allows) within seconds."""
    _reset_pg(pg_url)
    database = pg_url.rsplit("/", 1)[1]
    receiver = Receiver(hold=1.0)
    hooks = settings.model_copy(
        update={"webhooks": (receiver.url,), "webhook_timeout_seconds": 10.0}
    )
    try:
        with serve(hooks, pg_url) as server, client(server) as http:
            assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
            assert http.post("/v1/leases", json=_lease("l1", 1)).status_code == 201
            deadline = time.monotonic() + 10
            while not receiver.arrivals and time.monotonic() < deadline:
                time.sleep(0.02)
            assert receiver.arrivals, "the message was not sent"
            with (
                psycopg.connect(pg_url) as locker,
                psycopg.connect(pg_url, autocommit=True) as admin,
            ):
                locker.execute("SELECT id FROM outbox FOR UPDATE")
                _terminate_the_waiting_backend(admin, database)
                locker.rollback()
            cut = time.monotonic()
            while len(receiver.received) < 2 and time.monotonic() < cut + 10:
                time.sleep(0.05)
            assert len(receiver.received) == 2, "not sent again"
            assert time.monotonic() - cut < 6
            (first, _), (again, _) = receiver.received
            assert first["X-Climate-Delivery"] == again["X-Climate-Delivery"]
    finally:
        receiver.close()


def _mounted(args: list[str], where: Path) -> bool:
    where.mkdir()
    return subprocess.run(["mount", *args, str(where)], capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem of the test's own (tmpfs), to fill."""
    where = tmp_path / "small"
    if not _mounted(["-t", "tmpfs", "-o", "size=2m", "tmpfs"], where):
        pytest.skip("needs root to mount a small filesystem")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def _fill(folder: Path) -> Path:
    """Every block of ``folder``'s filesystem taken by one file."""
    filler = folder / "filler"
    out = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(out, b"\0" * 4096)
    finally:
        os.close(out)
    return filler


def _status(http: httpx.Client, lease_id: str) -> str:
    status: str = http.get(f"/v1/leases/{lease_id}").json()["lease"]["status"]
    return status


def _wait_for(http: httpx.Client, lease_id: str, status: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while (now := _status(http, lease_id)) != status and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def test_a_full_disk_under_serve_refuses_writes_naming_it_and_the_manager_waits_it_out(
    settings: Settings,
    sqlite_template: Path,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The disk of the SQLite file fills while the server runs: a write is a 503 saying 'disk
    full' (it said 'database unavailable ... may or may not have been made'), reads go on, the
    manager's lease start waits (one log line per try, no traceback) and runs once there is room
    again; nothing refused is half-written, the file is sound."""
    url = _sqlite_copy(sqlite_template, small_disk)
    with serve(settings, url) as server, client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        soon = http.post("/v1/leases", json=_lease_from_now("soon", seconds=3))
        assert soon.status_code == 201, soon.text
        soon_id = soon.json()["lease"]["id"]
        filler = _fill(small_disk)

        refused = http.post("/v1/leases", json=_lease("refused", 2))
        assert_error(refused, 503, "disk full", "not made")
        assert refused.headers["retry-after"] == "30"
        listed = http.get("/v1/leases")
        assert listed.status_code == 200
        assert [lease["name"] for lease in listed.json()["leases"]] == ["soon"]
        time.sleep(4)  # past the start: the manager cannot write it
        assert _status(http, soon_id) == "PENDING"

        filler.unlink()
        assert _wait_for(http, soon_id, "ACTIVE", 15) == "ACTIVE"
        names = [lease["name"] for lease in http.get("/v1/leases").json()["leases"]]
        assert names == ["soon"]
    failed_passes = [
        r for r in caplog.records if r.name == "climate.manager.service" and "failed" in r.message
    ]
    assert failed_passes and all("disk full" in r.message for r in failed_passes)
    assert not any(r.exc_info for r in failed_passes)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_deliverer_on_a_full_disk_waits_between_passes_instead_of_spinning(
    settings: Settings, sqlite_template: Path, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Due webhooks whose claim cannot be written: each failed job woke the next pass at once,
    which failed the same way, about a hundred times a second, each with a traceback."""
    url = _sqlite_copy(sqlite_template, small_disk)
    hooks = settings.model_copy(update={"webhooks": (f"http://127.0.0.1:{free_port()}/hook",)})
    database = Database(url)
    try:
        ctx = build_context(hooks, database, SystemClock())
        add_hosts(HostService(ctx), 1)
        now = dt.datetime.now(dt.UTC)
        LeaseService(ctx).create(ALICE, host_request("l1", now + HOUR, now + 2 * HOUR))
        filler = _fill(small_disk)
        deliverer = Deliverer(ctx)
        deliverer.start()
        time.sleep(4)
        deliverer.stop()
        filler.unlink()
    finally:
        database.dispose()
    failed = [r for r in caplog.records if r.name == "climate.notify.delivery"]
    assert 1 <= len(failed) <= 4, len(failed)  # after 0, 1, 3 s
    assert all("disk full" in r.message and not r.exc_info for r in failed)


@pytest.fixture
def fragile_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An ext4 filesystem of the test's own (a loop device) that the kernel makes read-only on
    its first error, as it does a failing disk's; ``trigger_fs_error`` makes one."""
    image, where = tmp_path / "ext4.img", tmp_path / "fragile"
    with image.open("wb") as out:
        out.truncate(8 * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    if made.returncode or not _mounted(["-o", "loop,errors=remount-ro", str(image)], where):
        pytest.skip("needs root, mkfs.ext4 and loop devices")
    device = Path(
        subprocess.run(
            ["findmnt", "-no", "SOURCE", str(where)], capture_output=True, text=True
        ).stdout.strip()
    )
    trigger = Path("/sys/fs/ext4") / device.name / "trigger_fs_error"
    try:
        if not trigger.exists():
            pytest.skip("the kernel cannot make an ext4 error on demand")
        yield where, trigger
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_filesystem_turned_read_only_under_serve_refuses_writes_naming_it(
    settings: Settings, sqlite_template: Path, fragile_disk: tuple[Path, Path]
) -> None:
    """The kernel makes the SQLite file's filesystem read-only after an error while the server
    runs: SQLite calls it a 'disk I/O error', and the write was answered 'database unavailable
    ... may or may not have been made'. Now: 'database is read-only', and reads go on."""
    where, trigger = fragile_disk
    url = _sqlite_copy(sqlite_template, where)
    with serve(settings, url) as server, client(server) as http:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        trigger.write_text("1")
        refused = http.post("/v1/leases", json=_lease("refused", 2))
        assert_error(refused, 503, "database is read-only", "filesystem", "not made")
        assert refused.headers["retry-after"] == "30"
        assert http.get("/v1/leases").json()["leases"] == []
        assert http.get("/v1/os-hosts").json()["hosts"][0]["hypervisor_hostname"] == "db0"


def test_a_postgresql_database_turned_read_only_refuses_writes_naming_it(
    live_pg: tuple[LiveServer, str],
) -> None:
    """The database made read-only for every new session (as a standby is), the server's
    sessions then cut: a write was a 500 'Internal Server Error' with a traceback (PostgreSQL's
    read_only_sql_transaction is not an operational error). Now: 503 'database is read-only'."""
    server, url = live_pg
    database = url.rsplit("/", 1)[1]
    with client(server) as http, psycopg.connect(url, autocommit=True) as admin:
        assert http.post("/v1/os-hosts", json={"name": "db0"}).status_code == 201
        admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            refused = http.post("/v1/leases", json=_lease("refused", 2))
            assert_error(refused, 503, "database is read-only", "not made")
            assert refused.headers["retry-after"] == "30"
            assert http.get("/v1/leases").json()["leases"] == []
        finally:
            admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
        assert http.post("/v1/leases", json=_lease("after", 2)).status_code == 201
