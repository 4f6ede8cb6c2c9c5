"""Engine and session factory. One ``Database`` per process, built at the entry point."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import bindparam, create_engine, event, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from climate import jsontext
from climate.db import allocations, change_feed, locking, raw, storage
from climate.db.change_feed import ChangeFeed
from climate.db.tables import Lock, table_of

ADMISSION_LOCK = "admission"
_SHARED = "admission_shared"
CHANGED = "allocations_changed"
_TELL = "admission_told"
AFTER_COMMIT = "after_commit"
"""``session.info`` key: what to do once a write transaction has committed and SQLite's
writers' turn is released (``Database.transaction``)."""
OUTBOX_LISTENERS = "outbox_listeners"
"""``session.info`` key: the callables of this process to call once a transaction that wrote
outbox messages has committed (``Database.outbox_listeners``, the deliverers' wake-ups)."""
"""A shared admission's reservations whose allocations it changed, logged as it commits."""
EXCLUSION_VIOLATION = "23P01"
INVENTORY_VERSION = "inventory"
"""Bumped by every inventory change, so that processes know when to reload their caches."""


_LOCKS = table_of(Lock).c
# Built once, and Core rather than an ORM update: this statement starts every write transaction.
_TAKE_LOCK = (
    update(table_of(Lock))
    .where(_LOCKS.name == bindparam("lock_name"))
    .values(version=_LOCKS.version + 1)
    .returning(_LOCKS.version)
)


LOG = logging.getLogger(__name__)
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001"})
"""PostgreSQL aborted the transaction to break a deadlock, or for a serialization conflict."""
TRANSIENT_ATTEMPTS = 3
CHECKPOINT_EVERY = 32
"""SQLite: commits between two WAL checkpoints, each on a thread of its own (``Checkpoints``)."""
WAL_BACKSTOP_PAGES = 10_000
"""SQLite: a commit that leaves the WAL this long (about 40 MB) checkpoints it on the committing
thread, as SQLite does at 1,000 pages by default: the WAL stays bounded should the background
checkpoints fail or fall behind."""
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


def overlap_refused(error: DBAPIError) -> bool:
    """Whether PostgreSQL refused ``error``'s statement for an exclusion constraint: an
    allocation overlapping another on the same resource."""
    return _sqlstate(error) == EXCLUSION_VIOLATION


def retry_transient(use_case: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a use case again, up to ``TRANSIENT_ATTEMPTS`` times in all, when the database
    aborted its transaction to break a deadlock: the transaction rolled back whole (in-memory
    caches included), so running it again is safe. The lock order (docs/architecture.md)
    keeps these rare; under load with several managers one can still happen."""

    @functools.wraps(use_case)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            try:
                return use_case(*args, **kwargs)
            except OperationalError as exc:
                state = _sqlstate(exc)
                if state not in TRANSIENT_SQLSTATES or attempt == TRANSIENT_ATTEMPTS:
                    raise
                LOG.warning("%s: transaction aborted (%s), running it again", use_case, state)
        raise AssertionError("unreachable")

    return run


class Database:
    """Owns the engine; hands out sessions, each one transaction that commits or rolls back."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine = _make_engine(url, echo)
        self.feed = (
            ChangeFeed(self.engine.url, ADMISSION_LOCK) if self.dialect == "postgresql" else None
        )
        self.outbox_listeners: list[Callable[[], None]] = []
        """Called once a transaction that wrote outbox messages commits: the deliverers of this
        process register their wake-up, so that a message the manager writes (a lease started,
        ended) is sent at once, not when the deliverer next looks on its own."""
        # Each session's info starts as a copy of this: the repository functions find the feed
        # and the outbox's listeners (the same list in every session).
        self._sessions = sessionmaker(
            self.engine,
            expire_on_commit=False,
            info={change_feed.FEED: self.feed, OUTBOX_LISTENERS: self.outbox_listeners},
        )
        path = _sqlite_file(url)
        self._writers = Writers(path, self.engine) if self.dialect == "sqlite" else None
        self._checkpoints = Checkpoints(self.engine) if path else None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def storage_problem(self, exc: BaseException) -> str | None:
        """``disk full: ...`` or ``database is read-only: ...`` when ``exc`` is this database
        unable to store a change for that reason (``db/storage.py``), else None."""
        return storage.storage_problem(exc, _sqlite_file(self.url))

    @contextlib.contextmanager
    def transaction(
        self, *, lock: str | None = None, rollback: bool = False, shared: bool = False
    ) -> Iterator[Session]:
        """One transaction; with ``lock``, serialised against every other holder of that lock;
        with ``rollback``, rolled back at the end of the block instead of committed (a dry run:
        the block's objects stay as built, nothing it wrote remains).

        ``shared`` (PostgreSQL; elsewhere ignored): the admission lock, when the block takes it,
        is taken in the shared mode (``db/locking.py``): other shared holders go on beside it,
        each locking the resources it books. The lock's version is then taken just before
        commit, numbering commits in their order (``session.info["lock_version"]`` from then
        on), with the changes of the reservations in ``session.info[CHANGED]`` logged under it
        for other processes' calendars (``allocation_changes``).

        The lock is taken first thing, which on SQLite makes the transaction a writer from its
        first statement (so it never has to upgrade a stale read snapshot) and on PostgreSQL holds
        a row lock until commit. The lock's new version is in ``session.info["lock_version"]``.

        In-memory state that follows the database (caches) registers callables in
        ``session.info["on_rollback"]`` and ``session.info["on_commit"]``; they run once the
        outcome is known. Undoing runs before the rollback, while the lock is still held: once
        it is released another transaction of this process may read that state. What follows a
        commit outside the database (logging the audit lines, waking the manager, deleting a
        Keystone trust) goes in ``session.info[AFTER_COMMIT]``: it runs once SQLite's writers'
        turn is released, so that the next writer does not wait for it.
        Callables in ``session.info["after_rollback"]`` run once a failed transaction's
        session is closed and its lock released: they may open transactions of their own.
        """
        later: list[Callable[[], None]] = []
        committed: list[Callable[[], None]] = []
        try:
            with self._writer() as connection, self._session(connection) as session:
                session.info["after_rollback"] = later
                if shared and self.dialect == "postgresql":
                    session.info[_SHARED] = False  # True once taken
                try:
                    with session.begin():
                        session.info[raw.CONNECTION] = session.connection(
                            execution_options={"climate_write": True}
                        )
                        if lock is not None:
                            self.lock(session, lock)
                        try:
                            yield session
                        except BaseException:
                            _undo(session)
                            raise
                        if rollback:
                            _undo(session)
                            session.rollback()
                        elif session.info.get(_SHARED):
                            self._number_commit(session)
                        elif _TELL in session.info:
                            allocations.tell(session, session.info[_TELL])
                except BaseException:
                    _undo(session)  # the commit failed
                    raise
                if rollback:
                    return
                if self._checkpoints is not None:
                    self._checkpoints.committed()
                for done in session.info.pop("on_commit", []):
                    done()
                committed = session.info.pop(AFTER_COMMIT, [])
        except BaseException:
            for then in later:
                then()
            raise
        for done in committed:
            done()

    @staticmethod
    def lock(session: Session, name: str) -> None:
        """Take the lock ``name`` for the rest of the transaction: every other holder waits until
        it ends; its new version is in ``session.info["lock_version"]``. The admission lock in a
        ``shared`` transaction is taken in the shared mode, its version only before commit.

        Taking it late keeps the serialised part short (PostgreSQL: writes nobody else can see
        yet go before it); on SQLite the transaction is the only writer from its start anyway.
        """
        session.flush()  # as an ORM statement would: what the block changed goes before the lock
        if name == ADMISSION_LOCK and session.get_bind().dialect.name == "postgresql":
            if _SHARED in session.info:
                locking.shared(session)
                session.info[_SHARED] = True
                return
            locking.exclusive(session)
        version = raw.rows(session, _TAKE_LOCK, {"lock_name": name})[0][0]
        session.info["lock_version"] = version
        if name == ADMISSION_LOCK and session.info.get(change_feed.FEED) is not None:
            session.info[_TELL] = version  # told to every process's change feed at commit

    @staticmethod
    def admitting(session: Session) -> bool:
        """Whether this transaction holds the admission lock, in either mode."""
        return "lock_version" in session.info or bool(session.info.get(_SHARED))

    @staticmethod
    def shares(session: Session) -> bool:
        """Whether this transaction holds the admission lock in the shared mode: what it books,
        it locks (``locking.try_resources``); other shared holders may be booking beside it."""
        return bool(session.info.get(_SHARED))

    def _number_commit(self, session: Session) -> None:
        # What runs at commit (the audit rows) runs first: numbering is the last statement,
        # sent with the COMMIT, and the row it locks is held only until that commit ends.
        session.dispatch.before_commit(session)
        session.flush()
        changed = session.info.pop(CHANGED, ())
        version = allocations.number_and_commit(session, ADMISSION_LOCK, changed)
        session.info["lock_version"] = version
        if allocations.prunes_at(version):
            session.info.setdefault("on_commit", []).append(lambda: self._prune(version))

    def _prune(self, version: int) -> None:
        with self.transaction(lock=ADMISSION_LOCK) as session:
            allocations.prune(session, version)

    @contextlib.contextmanager
    def _writer(self) -> Iterator[Connection | None]:
        """A writer's turn, and on a SQLite file the connection every writer shares."""
        if self._writers is None:
            yield None
            return
        with self._writers.turn() as connection:
            yield connection

    def _session(self, connection: Connection | None) -> Session:
        return self._sessions() if connection is None else self._sessions(bind=connection)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Session]:
        """A read-only transaction: a consistent snapshot that never blocks writers."""
        with self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        if self.feed is not None:
            self.feed.close()
        if self._checkpoints is not None:
            self._checkpoints.close()
        if self._writers is not None:
            self._writers.close()
        self.engine.dispose()


class Writers:
    """SQLite's writers, one at a time, queued on locks that block instead of polling: this
    process's threads on a lock, and for a database file every process on an exclusive
    ``flock`` of the file ``<database>-writers`` beside it, which the kernel hands to the next
    waiter as soon as it is released (and releases if its holder dies, kill -9 included).

    SQLite's own busy handler polls with sleeps growing to 100 ms, unfairly: a writer can
    starve under load, and between the two processes of ``climate api --workers 2`` writes
    waited up to seconds. It stays as the guard for writers that do not come through here
    (migrations, another program).
    """

    SUFFIX = "-writers"

    def __init__(self, path: str | None, engine: Engine) -> None:
        self._threads = threading.Lock()
        self._file: int | None = None
        # Writers of a file take turns, so they share one connection, kept open: one from the
        # pool for each transaction cost about 5% of an admission (checkout, checkin, reset).
        # Its page cache stays warm too, as no other connection of this process writes.
        self._engine = engine if path is not None else None
        self._connection: Connection | None = None
        if path is not None:
            try:
                self._file = os.open(
                    path + self.SUFFIX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
            except OSError as exc:
                LOG.warning(
                    "%s: cannot open %s (%s): writers of other processes wait in SQLite's busy "
                    "handler",
                    path,
                    path + self.SUFFIX,
                    exc.strerror,
                )

    @contextlib.contextmanager
    def turn(self) -> Iterator[Connection | None]:
        """Held while this writer's transaction runs; the writers' shared connection (None
        for a database in memory: each connection would be a database of its own)."""
        with self._threads:
            if self._file is not None:
                fcntl.flock(self._file, fcntl.LOCK_EX)
            try:
                yield self._shared()
            except DBAPIError as error:
                if not isinstance(error, IntegrityError):  # a refused row leaves it sound
                    self._drop()  # it may be broken: the next writer opens another
                raise
            finally:
                if self._file is not None:
                    fcntl.flock(self._file, fcntl.LOCK_UN)

    def _shared(self) -> Connection | None:
        if self._engine is None:
            return None
        if self._connection is None or self._connection.closed:
            self._connection = self._engine.connect()
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(DBAPIError):
                self._connection.close()
            self._connection = None

    def close(self) -> None:
        with self._threads:
            self._drop()
            self._engine = None
            if self._file is not None:
                os.close(self._file)
                self._file = None


class Checkpoints:
    """SQLite's WAL copied back into the database file off the request threads.

    SQLite checkpoints on the commit that grows the WAL past 1,000 pages: that request then
    writes the pages to the database file and waits for two fsyncs while holding the process's
    write lock. Here every ``CHECKPOINT_EVERY`` commits a PASSIVE checkpoint, which waits for
    no reader or writer, is handed to a thread of its own (started once: starting a thread waits
    for it to run); commits go on meanwhile. At most one runs at a time; the connections' own
    checkpoint is only a backstop (``WAL_BACKSTOP_PAGES``). A checkpoint cut short (kill -9) is
    safe: the WAL is the record until a checkpoint ends.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._commits = 0
        self._thread: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None

    def committed(self) -> None:
        with self._lock:
            self._commits += 1
            if self._commits < CHECKPOINT_EVERY:
                return
            if self._running is not None and not self._running.done():
                return
            self._commits = 0
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="climate-checkpoint")
            self._running = self._thread.submit(self._checkpoint)

    def join(self) -> None:
        """Wait for the checkpoint under way, if any."""
        with self._lock:
            running = self._running
        if running is not None:
            running.result()

    def close(self) -> None:
        """Wait for the checkpoint under way and end the thread (a later commit starts one)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=True)

    def _checkpoint(self) -> None:
        try:
            connection = self._engine.raw_connection()
            try:
                cursor = connection.cursor()
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                cursor.fetchall()
                cursor.close()
            finally:
                connection.close()
        except Exception:  # the next one copies these pages too; the backstop bounds the WAL
            LOG.warning("SQLite WAL checkpoint failed", exc_info=True)


def _sqlite_file(url: str) -> str | None:
    """The database file of a SQLite URL; None for another database or one in memory."""
    path = url.split("///", 1)[1] if "///" in url else ""
    return path if url.startswith("sqlite") and path not in ("", ":memory:") else None


def _undo(session: Session) -> None:
    for undo in reversed(session.info.pop("on_rollback", [])):
        undo()


def _make_engine(url: str, echo: bool) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        in_memory = path in ("", ":memory:")
        # The last connection handed back goes out first: SQLite drops a connection's page
        # cache whenever another one wrote since its last transaction, so reusing the last
        # writer keeps its cache warm (FIFO alternated two connections, every one cold).
        pooling: dict[str, Any] = {"poolclass": NullPool} if in_memory else {"pool_use_lifo": True}
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_serializer=jsontext.text,
            **pooling,
        )
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return create_engine(
        url,
        echo=echo,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        json_serializer=jsontext.text,
    )


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself, so that transactions really start there.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    # A writer takes the write lock at BEGIN: in WAL mode a reader that later writes fails with
    # SQLITE_BUSY_SNAPSHOT when another writer committed in between, whatever the busy timeout.
    write = connection.get_execution_options().get("climate_write", False)
    # On the driver's connection: SQLAlchemy's execution of one statement costs more than
    # SQLite's BEGIN itself, and every transaction runs one.
    raw.begin(connection, "BEGIN IMMEDIATE" if write else "BEGIN")
