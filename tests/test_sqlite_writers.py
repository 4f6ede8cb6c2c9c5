"""SQLite's writers of every process take turns on an exclusive ``flock`` of the file beside
the database (``climate.db.engine.Writers``), which the kernel hands on as soon as it is
released, instead of polling in SQLite's busy handler."""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from climate.db.engine import AFTER_COMMIT, Database, Writers


@pytest.fixture
def path(sqlite_url: str) -> str:
    return sqlite_url.split("///", 1)[1]


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def _free(path: str) -> bool:
    """Whether another process could take the writers' turn now."""
    other = os.open(path + Writers.SUFFIX, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(other)  # releases it if taken
    return True


FLOCK = {"x86_64": 73, "aarch64": 32}
"""The flock system call's number, by machine (``/proc/<pid>/syscall``)."""


def _in_flock(pid: int) -> bool:
    """Whether the process is blocked in ``flock`` (SQLite's busy handler would be sleeping in
    nanosleep, polling)."""
    proc = Path(f"/proc/{pid}")
    if proc.joinpath("wchan").read_text() == "locks_lock_inode_wait":
        return True
    call = proc.joinpath("syscall").read_text().split()[0]
    return call.isdigit() and int(call) == FLOCK.get(os.uname().machine)


def test_a_writer_holds_the_turn_until_its_transaction_ends(db: Database, path: str) -> None:
    assert _free(path)
    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
        assert not _free(path)
    assert _free(path)
    with pytest.raises(RuntimeError), db.transaction() as session:
        session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
        assert not _free(path)
        raise RuntimeError("rolled back")
    assert _free(path)
    with db.reader() as session:  # readers never take it
        assert session.execute(text("SELECT count(*) FROM scratch")).scalar_one() == 0
        assert _free(path)


def _driver(session: Session) -> object:
    return session.connection().connection.driver_connection


def test_writers_share_one_connection_whatever_became_of_the_last_transaction(
    db: Database,
) -> None:
    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER PRIMARY KEY)"))
        first = _driver(session)
    with pytest.raises(RuntimeError), db.transaction() as session:
        session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
        raise RuntimeError("rolled back")
    with pytest.raises(IntegrityError), db.transaction() as session:  # a refused row
        session.execute(text("INSERT INTO scratch (n) VALUES (2), (2)"))
    with db.transaction() as session:
        assert _driver(session) is first
        assert session.execute(text("SELECT count(*) FROM scratch")).scalar_one() == 0
        session.execute(text("INSERT INTO scratch (n) VALUES (3)"))
    with db.reader() as session:  # readers have connections of their own
        assert _driver(session) is not first
        assert session.execute(text("SELECT n FROM scratch")).scalars().all() == [3]


def test_a_broken_shared_connection_is_replaced_by_the_next_writer(db: Database) -> None:
    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
        broken = _driver(session)
    assert isinstance(broken, sqlite3.Connection)
    broken.close()  # as a fault underneath would leave it
    with pytest.raises(DBAPIError), db.transaction() as session:
        session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
    with db.transaction() as session:
        assert _driver(session) is not broken
        session.execute(text("INSERT INTO scratch (n) VALUES (2)"))
    with db.reader() as session:
        assert session.execute(text("SELECT n FROM scratch")).scalars().all() == [2]


def test_disposing_of_the_database_closes_the_shared_connection(sqlite_url: str) -> None:
    database = Database(sqlite_url)
    with database.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
        shared = _driver(session)
    assert isinstance(shared, sqlite3.Connection)
    database.dispose()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        shared.execute("SELECT 1")


def test_what_follows_a_commit_runs_once_the_turn_is_released(db: Database, path: str) -> None:
    """A commit's own follow-ups (audit lines, waking the manager, deleting a Keystone trust)
    keep no other writer waiting: the turn is free when they run, and one may even write."""
    seen: list[bool] = []

    def write() -> None:
        with db.transaction() as session:
            session.execute(text("INSERT INTO scratch (n) VALUES (2)"))

    def follow_up() -> None:
        seen.append(_free(path))
        writer = threading.Thread(target=write)  # the turn is this process's too
        writer.start()
        writer.join(timeout=10)
        seen.append(not writer.is_alive())

    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
        session.info.setdefault(AFTER_COMMIT, []).append(follow_up)
    assert seen == [True, True]
    with db.reader() as session:
        assert session.execute(text("SELECT n FROM scratch")).scalars().all() == [2]


def test_a_writer_of_another_process_waits_for_the_turn_then_writes(
    db: Database, sqlite_url: str
) -> None:
    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
    script = textwrap.dedent(
        f"""
        import time
        from sqlalchemy import text
        from climate.db.engine import Database
        db = Database({sqlite_url!r})
        print("ready", flush=True)
        with db.transaction() as session:
            session.execute(text("INSERT INTO scratch (n) VALUES (2)"))
        print("wrote", time.time(), flush=True)
        """
    )
    with db.transaction() as session:
        session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
        other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert other.stdout is not None
        assert other.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while not _in_flock(other.pid):  # it asks for the turn meanwhile, and waits in the kernel
            assert other.poll() is None and time.monotonic() < deadline, "not waiting in flock"
            time.sleep(0.02)
        released = time.time()
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 0
    assert float(out.split()[1]) >= released  # after this writer committed, not beside it
    with db.reader() as session:
        assert session.execute(text("SELECT n FROM scratch ORDER BY rowid")).scalars().all() == [
            1,
            2,
        ]


def test_without_the_file_writers_still_write_and_the_log_says_why(
    sqlite_url: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    Path(path + Writers.SUFFIX).mkdir()  # cannot be opened as a file
    with caplog.at_level(logging.WARNING):
        database = Database(sqlite_url)
    try:
        assert f"cannot open {path}{Writers.SUFFIX}" in caplog.text
        with database.transaction() as session:
            session.execute(text("CREATE TABLE scratch (n INTEGER)"))
            session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
        with database.reader() as session:
            assert session.execute(text("SELECT count(*) FROM scratch")).scalar_one() == 1
    finally:
        database.dispose()


def test_a_writer_killed_holding_the_turn_leaves_it_to_the_next(
    db: Database, sqlite_url: str, path: str
) -> None:
    """kill -9 mid-transaction: the kernel ends its flock with it, SQLite rolls its write
    back, and the next writer goes on at once."""
    with db.transaction() as session:
        session.execute(text("CREATE TABLE scratch (n INTEGER)"))
    script = textwrap.dedent(
        f"""
        import time
        from sqlalchemy import text
        from climate.db.engine import Database
        with Database({sqlite_url!r}).transaction() as session:
            session.execute(text("INSERT INTO scratch (n) VALUES (1)"))
            print("holding", flush=True)
            time.sleep(600)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline() == "holding\n"
    assert not _free(path)
    holder.kill()
    holder.wait()
    wrote = threading.Thread(target=_insert, args=(db, 2), daemon=True)
    wrote.start()
    wrote.join(timeout=30)
    assert not wrote.is_alive(), "the next writer still waits for a dead one"
    with db.reader() as session:
        assert session.execute(text("SELECT n FROM scratch")).scalars().all() == [2]


def _insert(db: Database, n: int) -> None:
    with db.transaction() as session:
        session.execute(text("INSERT INTO scratch (n) VALUES (:n)"), {"n": n})
