"""SQLite's WAL checkpoints run on a thread of their own, not on the committing request's
(``climate.db.engine.Checkpoints``), with the connections' own checkpoint as a bounded backstop."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from climate.db import engine
from climate.db.engine import WAL_BACKSTOP_PAGES, Database

EVERY = 3
BLOB = 64 * 1024


def _path(db: Database) -> Path:
    return Path(db.url.split("///", 1)[1])


def _commit_blob(db: Database) -> None:
    with db.transaction() as session:
        session.execute(text("CREATE TABLE IF NOT EXISTS scratch (data BLOB)"))
        session.execute(text("INSERT INTO scratch (data) VALUES (randomblob(:n))"), {"n": BLOB})


@pytest.fixture
def db(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(engine, "CHECKPOINT_EVERY", EVERY)
    database = Database(sqlite_url)
    yield database
    database.dispose()


def test_commits_leave_the_wal_to_the_checkpoint_thread_until_every_nth(db: Database) -> None:
    size = _path(db).stat().st_size
    for _ in range(EVERY - 1):
        _commit_blob(db)
    assert db._checkpoints is not None
    db._checkpoints.join()
    assert _path(db).stat().st_size == size  # the pages are in the WAL only

    _commit_blob(db)
    db._checkpoints.join()

    assert _path(db).stat().st_size >= size + EVERY * BLOB


def test_a_failed_checkpoint_is_logged_and_the_next_one_copies_its_pages(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    size = _path(db).stat().st_size
    assert db._checkpoints is not None

    class FailingOnce:
        def raw_connection(self) -> Any:
            monkeypatch.setattr(db._checkpoints, "_engine", db.engine)
            raise OSError("disk on fire")

    monkeypatch.setattr(db._checkpoints, "_engine", FailingOnce())
    with caplog.at_level(logging.WARNING, logger="climate.db.engine"):
        for _ in range(EVERY):
            _commit_blob(db)
        db._checkpoints.join()
    assert "WAL checkpoint failed" in caplog.text
    assert _path(db).stat().st_size == size

    for _ in range(EVERY):
        _commit_blob(db)
    db._checkpoints.join()

    assert _path(db).stat().st_size >= size + 2 * EVERY * BLOB


def test_a_connection_checkpoints_by_itself_only_past_the_backstop(db: Database) -> None:
    with db.reader() as session:
        pages = session.execute(text("PRAGMA wal_autocheckpoint")).scalar_one()

    assert pages == WAL_BACKSTOP_PAGES


def test_an_in_memory_database_has_no_checkpoint_thread() -> None:
    database = Database("sqlite://")

    assert database._checkpoints is None
    database.dispose()


def test_a_disposed_database_used_again_checkpoints_again(db: Database) -> None:
    for _ in range(EVERY):
        _commit_blob(db)
    db.dispose()
    size = _path(db).stat().st_size

    for _ in range(EVERY):
        _commit_blob(db)
    assert db._checkpoints is not None
    db._checkpoints.join()

    assert _path(db).stat().st_size >= size + EVERY * BLOB


def test_transactions_one_after_another_keep_to_the_connection_used_last(db: Database) -> None:
    """SQLite drops a connection's page cache when another wrote since its last transaction:
    with two connections in the pool (as once the checkpoint thread has taken one), the
    transactions of one thread after another keep to one of them, not the two in turn."""

    def connection(session: Any) -> int:
        return id(session.connection().connection.driver_connection)

    with db.reader() as first, db.reader() as second:
        assert connection(first) != connection(second)
    used = []
    for _ in range(EVERY - 1):  # no checkpoint among them
        with db.transaction() as session:
            used.append(connection(session))
    assert len(set(used)) == 1
