"""Cross-process wake-ups: another process committed something the manager should look at.

PostgreSQL: LISTEN on the events channel (the API NOTIFYs in the same transaction).
SQLite: watch ``PRAGMA data_version``, which changes when another connection commits; a cheap
read on a private connection, not a query of the events table.
"""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
import threading
from collections.abc import Callable

from climate.db.engine import Database
from climate.db.leases import EVENTS_CHANNEL

LOG = logging.getLogger(__name__)
SQLITE_WATCH_INTERVAL = 0.05


class WakeWatcher:
    """A daemon thread that calls ``wake`` whenever another process may have added work."""

    def __init__(self, db: Database, wake: Callable[[dt.datetime | None], None]) -> None:
        self.db = db
        self.wake = wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="climate-wake", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.db.dialect == "postgresql":
                    self._listen_postgres()
                else:
                    self._watch_sqlite()
            except Exception:
                LOG.exception("wake-up watcher failed; retrying in 1 s")
                self._stop.wait(1.0)

    def _listen_postgres(self) -> None:
        import psycopg
        import psycopg.sql

        url = self.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(EVENTS_CHANNEL))
            )
            while not self._stop.is_set():
                for notice in conn.notifies(timeout=0.5, stop_after=1):
                    self.wake(_when(notice.payload))

    def _watch_sqlite(self) -> None:
        path = self.db.engine.url.database or ""
        if not path or path == ":memory:":
            self._stop.wait()
            return
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            while not self._stop.wait(SQLITE_WATCH_INTERVAL):
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != last:
                    last = version
                    self.wake(None)
        finally:
            conn.close()


def _when(payload: str) -> dt.datetime | None:
    """The earliest changed event's time sent with a NOTIFY (None if absent or unreadable)."""
    try:
        return dt.datetime.fromisoformat(payload)
    except ValueError:
        return None
