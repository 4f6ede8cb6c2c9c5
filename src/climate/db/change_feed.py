"""What each admission changed, pushed to every process (PostgreSQL NOTIFY) instead of read back.

Every transaction that takes the admission lock's next version (``Database.lock``, or a shared
admission's numbering at commit) logs the reservations whose allocations it changed in
``allocation_changes`` and, in the same transaction, NOTIFYs them on ``CHANNEL``: the payload is
the version, then the reservation ids (``payload``). PostgreSQL delivers a transaction's
notifications only if it commits, and in commit order.

A process's in-memory calendars catch up from a version to the one their transaction sees
(``allocations.changes_since``). With a ``ChangeFeed`` listening, the changes of every version in
between are usually here already, and no query of the log is needed. Wherever the feed cannot
vouch for every version in between (it began listening later, a notification has not arrived
yet, a payload too long to carry its ids, the connection was lost and listening began again),
the caller reads the log as before: the feed only ever saves a query, it never decides alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from sqlalchemy.engine import URL

from climate import metrics

LOG = logging.getLogger(__name__)

CHANNEL = "climate_allocations"
FEED = "change_feed"
"""Where a session's info holds its database's feed (None: the database has none)."""
TOLD = "changes_told"
"""Where a session's info collects what each version it took changed, to be told at commit."""
MOST_PAYLOAD = 7_900
"""Bytes of ids a notification carries (PostgreSQL's limit is 8,000 for the whole payload)."""
TOO_MANY = "*"
"""In place of the ids: more than a payload carries; read the log for this version."""
KEEP_VERSIONS = 10_000
"""Versions remembered; a calendar further behind reads the log (which keeps as many)."""
RETRY_SECONDS = 1.0
POLL_SECONDS = 0.25
"""How often the listening thread looks whether it should stop."""


def payload(version: int, reservation_ids: Collection[str]) -> str:
    """The notification of ``version``: ``"<version>"`` alone when it changed no allocations,
    else ``"<version> <id>,<id>..."``, or ``"<version> *"`` when the ids do not fit."""
    return f"{version}{ids_part(reservation_ids)}"


def ids_part(reservation_ids: Collection[str]) -> str:
    """``payload`` after its version (from its leading space; empty for no ids), for SQL that
    appends it to a version it takes itself (``allocations.number_and_commit``)."""
    if not reservation_ids:
        return ""
    ids = ",".join(sorted(reservation_ids))
    return f" {ids if len(ids) <= MOST_PAYLOAD else TOO_MANY}"


def parse(text: str) -> tuple[int, frozenset[str] | None] | None:
    """A notification's version and ids (None for the ids: read the log); None if unreadable."""
    version, _, ids = text.partition(" ")
    try:
        number = int(version)
    except ValueError:
        return None
    if ids == TOO_MANY:
        return number, None
    return number, frozenset(ids.split(",")) if ids else frozenset()


class Told:
    """What the notifications told so far: per version, the reservations it changed."""

    def __init__(self) -> None:
        self.since: int | None = None
        """Every version after this one is told here (None: not listening)."""
        self._versions: dict[int, frozenset[str] | None] = {}

    def heard(self, text: str) -> None:
        found = parse(text)
        if found is None:
            LOG.warning("unreadable %s notification: %r", CHANNEL, text[:80])
            return
        self._versions[found[0]] = found[1]
        if len(self._versions) > KEEP_VERSIONS:
            # Versions come in commit order, which is their order: the first is the oldest.
            del self._versions[next(iter(self._versions))]
            self.since = max(self.since or 0, next(iter(self._versions)) - 1)

    def listening_from(self, version: int | None) -> None:
        """Every version after ``version`` will be told; None: listening stopped, and what is
        told from now on may have gaps."""
        self.since = version
        if version is None:
            self._versions.clear()

    def between(self, after: int, upto: int) -> set[str] | None:
        """The reservations changed by versions ``after`` + 1 to ``upto``; None unless every
        one of them was told with its ids."""
        if self.since is None or after < self.since or upto - after > KEEP_VERSIONS:
            return None
        changed: set[str] = set()
        for version in range(after + 1, upto + 1):
            ids = self._versions.get(version)
            if ids is None:  # not (yet) told, or too many to tell
                return None
            changed |= ids
        return changed

    def latest(self) -> int | None:
        return max(self._versions, default=None)


class ChangeFeed:
    """Listens on ``CHANNEL`` in a thread of its own (``start``, or the first ``changes``)."""

    APPLICATION_NAME = "climate-change-feed"

    def __init__(self, url: URL, lock_name: str) -> None:
        self._url = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._lock_name = lock_name
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._told = Told()
        self.served = 0
        """Catch-ups answered from the feed."""
        self.missed = 0
        """Catch-ups the feed could not answer (the caller read the log)."""

    def changes(self, after: int, upto: int) -> set[str] | None:
        """The reservations changed by versions ``after`` + 1 to ``upto``, or None where the
        feed cannot vouch for every one of them."""
        self.start()
        with self._guard:
            found = self._told.between(after, upto)
            if found is None:
                self.missed += 1
            else:
                self.served += 1
        metrics.CATCH_UPS.labels("log" if found is None else "feed").inc()
        return found

    @property
    def listening(self) -> bool:
        with self._guard:
            return self._told.since is not None

    def latest(self) -> int | None:
        """The highest version told so far (None: none since listening began)."""
        with self._guard:
            return self._told.latest()

    def start(self) -> None:
        if self._thread is not None:
            return
        with self._guard:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name="climate-change-feed", daemon=True
            )
        self._thread.start()

    def close(self) -> None:
        """Stop listening (the thread ends within ``POLL_SECONDS``; nothing waits for it)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception:
                LOG.warning("%s listener lost; listening again in 1 s", CHANNEL, exc_info=True)
            with self._guard:
                self._told.listening_from(None)
            self._stop.wait(RETRY_SECONDS)

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(
            self._url, autocommit=True, application_name=self.APPLICATION_NAME
        ) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            # Read after LISTEN took effect: every version committed after it is notified here.
            row = conn.execute(
                "SELECT version FROM locks WHERE name = %s", (self._lock_name,)
            ).fetchone()
            with self._guard:
                self._told.listening_from(int(row[0] or 0) if row else 0)
            while not self._stop.is_set():
                for notice in conn.notifies(timeout=POLL_SECONDS):
                    with self._guard:
                        self._told.heard(notice.payload)
