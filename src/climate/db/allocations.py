"""What every allocation table shares: the filters of the allocation endpoints, the leases
holding a resource, deleting a resource with its allocations, and the log of allocation changes
that in-memory calendars catch up from."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVarTuple

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    Update,
    bindparam,
    case,
    delete,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.elements import BindParameter

from climate.db import change_feed, raw
from climate.db.change_feed import ChangeFeed
from climate.db.tables import AllocationChange, Lease, Lock, Reservation, built, new_id, table_of

_Row = TypeVarTuple("_Row")
CALENDAR_PRUNED = "calendar_pruned"
KEEP_CHANGES = 10_000
"""Versions of allocation changes kept; a process further behind reloads its calendar whole."""


class Resource(Protocol):
    """An inventory row: a host, an item, a volume pool."""

    @property
    def id(self) -> int: ...


def narrowed(
    query: Select[*_Row],
    model: Any,
    *,
    lease_id: str | None = None,
    reservation_id: str | None = None,
    project_id: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> Select[*_Row]:
    """``query`` (joined with ``leases``) kept to the allocations of that lease, reservation or
    project that overlap [start, end), as far as each is given. ``model`` is an allocation
    table's model: ``lease_id``, ``reservation_id``, ``start_date``, ``end_date``."""
    if lease_id is not None:
        query = query.where(model.lease_id == lease_id)
    if reservation_id is not None:
        query = query.where(model.reservation_id == reservation_id)
    if project_id is not None:
        query = query.where(Lease.project_id == project_id)
    if start is not None:
        query = query.where(model.end_date > start)
    if end is not None:
        query = query.where(model.start_date < end)
    return query


def leases_holding(
    session: Session, resource: InstrumentedAttribute[int], resource_id: int, since: dt.datetime
) -> list[str]:
    """Ids of the leases with an allocation of ``resource_id`` that ends after ``since``;
    ``resource`` is the allocation table's column naming the resource (``HostAllocation.host_id``).
    """
    model = resource.class_
    rows = session.execute(
        select(model.lease_id)
        .where(resource == resource_id, model.end_date > since)
        .distinct()
        .order_by(model.lease_id)
    )
    return [r[0] for r in rows]


def params_holding(
    session: Session, resource: InstrumentedAttribute[int], resource_id: int, since: dt.datetime
) -> list[dict[str, Any]]:
    """The parameters of the reservations with an allocation of ``resource_id`` that ends after
    ``since``, one each; ``resource`` as for ``leases_holding``."""
    model = resource.class_
    holding = select(model.reservation_id).where(resource == resource_id, model.end_date > since)
    query = select(Reservation.params).where(Reservation.id.in_(holding)).order_by(Reservation.id)
    return [dict(row[0]) for row in session.execute(query)]


def remove(
    session: Session, row: Resource, resource: InstrumentedAttribute[int], version: int
) -> None:
    """Delete ``row`` with its (past) allocations, the rows whose ``resource`` column names it,
    logging the reservations that held it at admission ``version`` for in-memory calendars."""
    model = resource.class_
    owners = session.scalars(
        select(model.reservation_id).where(resource == row.id).distinct()
    ).all()
    session.execute(delete(model).where(resource == row.id))
    if owners:
        record_changes(session, version, owners)
    session.delete(row)
    session.flush()


def replace(
    session: Session,
    resource: InstrumentedAttribute[int],
    reservation_id: str,
    lease_id: str,
    resource_ids: Iterable[int],
    start: dt.datetime,
    end: dt.datetime,
    *,
    fresh: bool = False,
    since: dt.datetime | None = None,
    starts: Mapping[int, dt.datetime] | None = None,
) -> list[Any]:
    """Give the reservation exactly ``resource_ids`` (values of the allocation table's
    ``resource`` column) over [start, end) (``fresh``: it holds none yet); returns its rows
    as objects outside the session (Core statements: no flush, no reload).

    ``since``: the reservation runs and is changed at ``since``. Its rows that ended by then
    (its past, such as a failed host's before healing) stay; a resource it held keeps its start
    (``starts``, from its rows as they were), and one it gains is held from ``since``, not from
    before it was added."""
    model: Any = resource.class_
    table = table_of(model)
    mine = table.c.reservation_id == reservation_id
    kept: list[dict[str, Any]] = []
    if since is not None:
        past = select(table).where(mine, table.c.end_date <= since)
        kept = [dict(row) for row in session.execute(past).mappings()]
        session.execute(delete(table).where(mine, table.c.end_date > since))
    elif not fresh:
        session.execute(delete(table).where(mine))
    gained = start if since is None else max(start, since)
    rows = [
        {
            "id": new_id(),
            "reservation_id": reservation_id,
            "lease_id": lease_id,
            resource.key: resource_id,
            "start_date": (starts or {}).get(resource_id, gained),
            "end_date": end,
        }
        for resource_id in sorted(resource_ids)
    ]
    raw.write(session, _insert_into(table), rows)
    return [built(model, **row) for row in [*kept, *rows]]


@functools.cache
def _insert_into(table: Table) -> Insert:
    # One statement per table: raw.write compiles each statement once.
    return insert(table)


def truncate(session: Session, model: Any, reservation_id: str, at: dt.datetime) -> None:
    """End the reservation's allocations in ``model``'s table at ``at`` (drop those that had
    not begun). Two Core statements, each once: the ORM's bulk delete, then its load and flush of
    each row ended, were a quarter of a deletion's time. The session's objects of those rows
    follow: a row deleted leaves the session, a row ended shows its new end, unchanged for it."""
    dropping, ending = _truncating(table_of(model))
    window = [{"owner": reservation_id, "at": at}]
    raw.write(session, dropping, window)  # flushes first, as Session.execute would
    raw.write(session, ending, window)
    for obj in list(session.identity_map.values()):
        if not isinstance(obj, model):
            continue
        state = obj.__dict__
        if state.get("reservation_id") != reservation_id or "start_date" not in state:
            continue
        if state["start_date"] >= at:
            session.expunge(obj)
        elif state.get("end_date", at) > at:
            set_committed_value(obj, "end_date", at)


@functools.cache
def _truncating(table: Table) -> tuple[Delete, Update]:
    at: BindParameter[dt.datetime] = bindparam("at")
    mine = table.c.reservation_id == bindparam("owner")
    return (
        delete(table).where(mine, table.c.start_date >= at),
        update(table).where(mine, table.c.end_date > at).values(end_date=at),
    )


def record_changes(session: Session, version: int, reservation_ids: Iterable[str]) -> None:
    """Log that these reservations' allocations changed at admission ``version``; now and then
    forget old entries (a process that far behind reloads everything)."""
    ids = list(reservation_ids)
    raw.write(
        session,
        _insert_into(table_of(AllocationChange)),
        [{"version": version, "reservation_id": rid} for rid in ids],
    )
    if session.info.get(change_feed.FEED) is not None:
        session.info.setdefault(change_feed.TOLD, {}).setdefault(version, set()).update(ids)
    if prunes_at(version):
        prune(session, version)


def tell(session: Session, version: int) -> None:
    """PostgreSQL: notify every process's change feed, at commit, of what this transaction
    changed under ``version`` (the admission lock's, taken in the exclusive mode), even nothing:
    a version never told makes the feeds read the log for it."""
    told: dict[int, set[str]] = session.info.pop(change_feed.TOLD, {})
    told.setdefault(version, set())
    for number, ids in sorted(told.items()):
        raw.rows(
            session,
            _NOTIFY,
            {"channel": change_feed.CHANNEL, "payload": change_feed.payload(number, ids)},
        )


_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


_NUMBER_AND_LOG = text(
    "WITH numbered AS (UPDATE locks SET version = version + 1 WHERE name = :lock_name"
    " RETURNING version),"
    " logged AS (INSERT INTO allocation_changes (version, reservation_id)"
    " SELECT numbered.version, owner FROM numbered, unnest(CAST(:owners AS text[])) AS owner),"
    " told AS (SELECT pg_notify(:channel, numbered.version || :ids) FROM numbered)"
    " SELECT version FROM numbered, told"
)


def number_and_commit(session: Session, lock_name: str, reservation_ids: Iterable[str]) -> int:
    """PostgreSQL: take the next version of lock ``lock_name``, log these reservations'
    changes under it, notify every process's change feed of them and commit, in one round
    trip (a shared admission's last statement: the row stays locked only until the commit
    ends). The caller prunes the log if ``prunes_at`` the version."""
    owners = sorted(reservation_ids)
    parameters = {
        "lock_name": lock_name,
        "owners": owners,
        "channel": change_feed.CHANNEL,
        "ids": change_feed.ids_part(owners),
    }
    version: int = raw.rows_then_commit(session, _NUMBER_AND_LOG, parameters)[0][0]
    return version


def prunes_at(version: int) -> bool:
    """Whether the log's old entries go once ``version`` has committed (``prune``)."""
    return version % 1000 == 0 and version > KEEP_CHANGES


def prune(session: Session, version: int) -> None:
    """Forget the log's entries ``KEEP_CHANGES`` versions before ``version``, under the
    admission lock."""
    horizon = version - KEEP_CHANGES
    session.execute(delete(AllocationChange).where(AllocationChange.version <= horizon))
    # Never back: a later prune may have committed first (shared admissions prune after
    # their commit), and the log no longer holds what it cut.
    session.execute(
        update(Lock)
        .where(Lock.name == CALENDAR_PRUNED)
        .values(version=case((Lock.version < horizon, horizon), else_=Lock.version))
    )


def changes_since(session: Session, version: int, upto: int) -> set[str] | None:
    """Reservations whose allocations changed after ``version`` (up to ``upto`` at least, the
    version ``session`` sees): from the database's change feed if it has them all, else from
    the log; None if the log no longer reaches back that far."""
    feed: ChangeFeed | None = session.info.get(change_feed.FEED)
    if feed is not None:
        told = feed.changes(version, upto)
        if told is not None:
            return told
    changed = {row[0] for row in raw.rows(session, _CHANGED_SINCE, {"version": version})}
    # Read after the log: a reader on PostgreSQL (read committed, no admission lock) sees each
    # statement's own snapshot, and a prune committing between the two would otherwise cut
    # entries it had not read, with a horizon it had read as still behind.
    horizon = max((row[0] or 0 for row in raw.rows(session, _PRUNED, {})), default=0)
    return None if version < horizon else changed


# Built once: every request that reads a calendar or a listing catches up through these.
_CHANGED_SINCE = select(AllocationChange.reservation_id).where(
    AllocationChange.version > bindparam("version")
)
_PRUNED = select(Lock.version).where(Lock.name == CALENDAR_PRUNED)
