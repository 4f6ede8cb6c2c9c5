"""What an operator's checks and metrics read: the database's pulse, the managers' heartbeats
(or the SQLite manager's lock file), the outbox backlog, lease counts and the times of events
just run. Each one cheap: an indexed count or an aggregate, never a row per lease."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Collection

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from climate.db import outbox
from climate.db.engine import Database
from climate.db.tables import Event, Lease, ManagerProcess, OutboxMessage
from climate.db.types import among, as_utc


def ping(session: Session) -> None:
    session.execute(text("SELECT 1"))


def newest_heartbeat(session: Session) -> dt.datetime | None:
    """The latest heartbeat of any registered manager (PostgreSQL's managers table)."""
    value = session.scalar(select(func.max(ManagerProcess.heartbeat_at)))
    return None if value is None else as_utc(value)


def outbox_backlog(session: Session) -> int:
    """Notifications not yet delivered (and not dead-lettered)."""
    return _outbox_count(session, outbox.PENDING)


def dead_letters(session: Session) -> int:
    return _outbox_count(session, outbox.DEAD)


def _outbox_count(session: Session, status: str) -> int:
    query = select(func.count()).select_from(OutboxMessage).where(OutboxMessage.status == status)
    return int(session.scalar(query) or 0)


def lease_counts(session: Session, *, by_project: bool = False) -> dict[tuple[str, ...], int]:
    """Live (not deleted) leases by status, or by (project, status) with ``by_project``."""
    keys = [Lease.project_id, Lease.status] if by_project else [Lease.status]
    rows = session.execute(
        select(*keys, func.count()).where(Lease.deleted_at.is_(None)).group_by(*keys)
    )
    return {tuple(str(v) for v in row[:-1]): int(row[-1]) for row in rows}


def event_times(session: Session, event_ids: Collection[str]) -> dict[str, dt.datetime]:
    """The scheduled time of each of these events, by id."""
    if not event_ids:
        return {}
    rows = session.execute(select(Event.id, Event.time).where(among(Event.id, event_ids)))
    return {str(event_id): time for event_id, time in rows}


def manager_lock_path(db: Database) -> str | None:
    """The file a SQLite database's manager locks and touches; None for an in-memory one,
    which is this process's alone."""
    path = db.engine.url.database or ""
    return None if not path or path == ":memory:" else f"{path}-manager"


def last_heartbeat(db: Database) -> dt.datetime | None:
    """When a manager of this database last showed it is alive (wall clock), if one ever did:
    the newest heartbeat (PostgreSQL), or the SQLite manager's lock file last touched. A
    stopped manager's last sign stays, and ages."""
    if db.dialect != "sqlite":
        with db.reader() as session:
            return newest_heartbeat(session)
    path = manager_lock_path(db)
    try:
        return None if path is None else dt.datetime.fromtimestamp(os.stat(path).st_mtime, dt.UTC)
    except FileNotFoundError:
        return None
