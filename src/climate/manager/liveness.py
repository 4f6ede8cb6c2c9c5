"""How a manager shows that it is alive, so that a dead one's event claims are taken over within
seconds and a live one's never are.

- PostgreSQL, where several managers share the database: ``Heartbeat``, a thread of its own that
  records the manager alive every ``manager_heartbeat_seconds`` whatever the event loop is doing
  (``db/managers.py`` says how the others read it).
- SQLite: ``SoleManager``. One manager per database file: it holds an exclusive lock on a file
  beside the database for as long as its process lives (the kernel lets go when the process
  dies, however it dies). Holding it, the manager knows that every event claim in the database
  is a gone manager's, and ends them all at start-up. A heartbeat could not work there: the
  manager holds SQLite's write lock while it waits for the backend, so it could not write one.
  Its liveness for ``/readyz`` and the metrics is that file's modification time instead, touched
  every ``manager_heartbeat_seconds`` by a thread of its own (``db.ops.last_heartbeat``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import threading
from typing import IO

from climate.config import Settings
from climate.db import events as event_rows
from climate.db import managers, ops
from climate.db.engine import Database
from climate.domain.clock import Clock
from climate.errors import ClimateError

LOG = logging.getLogger(__name__)


class ManagerAlreadyRunning(ClimateError):
    pass


class Heartbeat:
    """Beats for the manager ``name`` from ``start`` (which writes the first beat, before the
    manager claims anything) until ``stop``. A stopped manager's row stays, silent: the others
    take over whatever it left claimed as for a crashed one."""

    def __init__(self, db: Database, name: str, settings: Settings) -> None:
        self.db = db
        self.name = name
        self.interval = settings.manager_heartbeat_seconds
        # A manager silent this long has no claim left that has not expired.
        self.forget_after = dt.timedelta(
            seconds=settings.manager_dead_seconds + settings.event_claim_seconds
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="climate-heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:
                LOG.exception("heartbeat of manager %s failed; trying again", self.name)

    def _beat(self) -> None:
        now = managers.wall_now()
        with self.db.transaction() as session:
            managers.beat(session, self.name, now)
            managers.prune(session, now - self.forget_after)


class SoleManager:
    """The lock that makes a manager the only one on its SQLite file; taken at construction,
    after which the claims left by the manager that held it before are ended."""

    def __init__(self, db: Database, clock: Clock, interval: float = 1.0) -> None:
        self._file: IO[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        path = ops.manager_lock_path(db)
        if path is not None:
            self._file = _lock(path)
            self._thread = threading.Thread(
                target=self._touch, args=(path, interval), name="climate-heartbeat", daemon=True
            )
            self._thread.start()
        with db.transaction() as session:
            released = event_rows.expire_claims(session, clock.now())
        if released:
            LOG.warning(
                "%d event(s) were claimed by a manager that is gone; running them again",
                released,
            )

    def _touch(self, path: str, interval: float) -> None:
        failing = False
        while not self._stop.wait(interval):
            try:
                os.utime(path)
            except OSError as exc:
                # Once per outage: a read-only filesystem fails every touch until it is fixed.
                if not failing:
                    LOG.error(
                        "heartbeat of the manager (touching %s) failed: %s; trying again every "
                        "%g s",
                        path,
                        exc.strerror or exc,
                        interval,
                    )
                failing = True
            else:
                if failing:
                    LOG.info("heartbeat of the manager (touching %s) works again", path)
                failing = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._file is not None:
            self._file.close()
            self._file = None


def _lock(path: str) -> IO[str]:
    handle = open(path, "a+")  # held open (and locked) for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ManagerAlreadyRunning(
            f"a manager ({holder}) already runs on this SQLite database; one manager per "
            "database file (use PostgreSQL for several)"
        ) from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def start_liveness(
    db: Database, name: str, settings: Settings, clock: Clock
) -> Heartbeat | SoleManager:
    """What the manager ``name`` needs before it starts, by database."""
    if db.dialect == "sqlite":
        return SoleManager(db, clock, settings.manager_heartbeat_seconds)
    heartbeat = Heartbeat(db, name, settings)
    heartbeat.start()
    return heartbeat
