"""The allocations a listing shows, kept in memory per host and in step with the database.

``GET /v1/os-hosts/allocations`` and ``GET /v1/instances/allocations`` show allocations from
now on: thousands of rows read, made into tuples and grouped on each call, the same rows from
one call to the next. This keeps one allocation table's rows per host and catches up as the
calendars do (``calendar_cache``): the admission version numbers every committed change of an
allocation table (allocations change only under the admission lock), and
``allocation_changes`` names the reservations each change touched. Those are read again; the
rest is kept. Each host carries a stamp that moves whenever its rows change, so that a caller
can keep what it made of a host's rows (their JSON: ``api/allocation_renders.py``).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from climate.db import allocations as allocation_rows
from climate.db import leases as lease_rows
from climate.db.tables import Lease
from climate.db.types import among, iso_text

RELOAD_AFTER = dt.timedelta(hours=6)
"""How long rows are kept before everything is read again: the rows that ended meanwhile go."""
_MARGIN = dt.timedelta(minutes=5)
"""How far before the load the rows go back: listings from a moment ago are answered too."""


class Shown(Protocol):
    """A reservation's allocation of a resource as a listing shows it (times as
    ``lease_text``)."""

    @property
    def reservation_id(self) -> str: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def start_date(self) -> str: ...
    @property
    def end_date(self) -> str: ...


class Listed(Shown, Protocol):
    """An allocation of a live lease as a listing keeps it."""

    @property
    def host_id(self) -> int: ...
    @property
    def project_id(self) -> str: ...


R = TypeVar("R", bound=Listed)

Loader = Callable[[Session, dt.datetime, Collection[str] | None, Collection[int]], list[R]]
"""The rows of live leases ending after a time: all of them (reservations None), or those of
these reservations or on these hosts."""


NO_END = "~"
"""Lease text after every time: the earliest end of no rows."""


def lease_text(value: dt.datetime) -> str:
    """A time as the allocation listings show it, and compare it as text: naive UTC ISO 8601
    with microseconds (``types.iso_text``)."""
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat("T", "microseconds")


class AllocationListing(Generic[R]):
    """One allocation table's rows (as ``load`` reads them), per host."""

    def __init__(
        self, load: Loader[R], host_of_owner: Callable[[str], int | None] = lambda _: None
    ) -> None:
        self._load = load
        self._host_of_owner = host_of_owner
        """The host whose rows are all to be read again when the log names this owner (the
        log names instance usage by host), None for a reservation."""
        self._guard = threading.Lock()
        self._version: int | None = None
        self._loaded_at = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._horizon = ""  # rows that end at or before this (lease text) are not kept
        self._of: dict[str, set[int]] = {}  # reservation -> its hosts (or more)
        # Host -> its rows by start, then reservation. A host's list is replaced, never changed:
        # callers read what they were given after the guard is released.
        self._hosts: dict[int, list[R]] = {}
        self._ends: dict[int, str] = {}  # host -> the earliest end of its rows
        self._stamps: dict[int, int] = {}
        self._stamped = 0

    def per_host(
        self, session: Session, host_ids: Sequence[int], since: dt.datetime, now: dt.datetime
    ) -> list[tuple[int, int, Sequence[R], str]] | None:
        """Each of ``host_ids`` with its stamp, its rows as committed when ``session`` began
        (or later), those ending after ``since`` among them only as far as the caller
        filters, and the earliest end among them (``NO_END`` for none: when it is after
        ``since``, every row is); None when ``since`` is before what is kept."""
        with self._guard:
            if not self._synced(session, since, now):
                return None
            none: Sequence[R] = ()
            return [
                (h, self._stamps.get(h, 0), self._hosts.get(h, none), self._ends.get(h, NO_END))
                for h in host_ids
            ]

    def hosts(
        self,
        session: Session,
        since: dt.datetime,
        now: dt.datetime,
        *,
        project_id: str | None,
        after: int | None,
        limit: int,
    ) -> list[int] | None:
        """The first ``limit`` hosts (by id, after ``after``) with rows ending after ``since``
        (of ``project_id`` unless None); None when ``since`` is before what is kept."""
        since_text = lease_text(since)
        with self._guard:
            if not self._synced(session, since, now):
                return None
            # The ids under the guard: a catching up adds hosts to the dict; their lists are
            # replaced, never changed, and read after it.
            hosts = self._hosts
            ids = sorted(h for h in hosts if after is None or h > after)
        found = []
        for host in ids:
            if any(
                row.end_date > since_text and project_id in (None, row.project_id)
                for row in hosts[host]
            ):
                found.append(host)
                if len(found) == limit:
                    break
        return found

    def _synced(self, session: Session, since: dt.datetime, now: dt.datetime) -> bool:
        """Catch up with what ``session`` sees; whether ``since`` is within what is kept."""
        version = lease_rows.admission_version(session)
        if self._version is None or now - self._loaded_at > RELOAD_AFTER:
            self._reload(session, now)
        elif self._version < version:
            changed = allocation_rows.changes_since(session, self._version, version)
            if changed is None:
                self._reload(session, now)
            else:
                self._reread(session, changed)
        self._version = max(self._version or 0, version)
        return lease_text(since) >= self._horizon

    def _reload(self, session: Session, now: dt.datetime) -> None:
        after = now - _MARGIN
        self._of, self._hosts = {}, {}
        for row in self._load(session, after, None, ()):
            self._of.setdefault(row.reservation_id, set()).add(row.host_id)
            self._hosts.setdefault(row.host_id, []).append(row)
        for kept in self._hosts.values():
            kept.sort(key=order)
        self._ends = {h: min(r.end_date for r in rows) for h, rows in self._hosts.items()}
        self._stamped += 1
        self._stamps = dict.fromkeys(self._hosts, self._stamped)
        self._loaded_at, self._horizon = now, lease_text(after)

    def _reread(self, session: Session, changed: Collection[str]) -> None:
        after = dt.datetime.fromisoformat(self._horizon).replace(tzinfo=dt.UTC)
        whole: set[int] = set()
        reservations: set[str] = set()
        for owner in changed:
            host = self._host_of_owner(owner)
            if host is None:
                reservations.add(owner)
            else:
                whole.add(host)
        touched: dict[int, list[R]] = {}
        for host in whole.union(*(self._of.pop(r, ()) for r in reservations)):
            touched[host] = [
                r
                for r in self._hosts.get(host, ())
                if r.reservation_id not in reservations and r.host_id not in whole
            ]
        for row in self._load(session, after, reservations, whole):
            self._of.setdefault(row.reservation_id, set()).add(row.host_id)
            if row.host_id not in touched:
                touched[row.host_id] = list(self._hosts.get(row.host_id, ()))
            touched[row.host_id].append(row)
        self._stamped += 1
        for host, rows in touched.items():
            rows.sort(key=order)
            self._hosts[host] = rows
            self._ends[host] = min((r.end_date for r in rows), default=NO_END)
            self._stamps[host] = self._stamped


def loader(model: Any, make: Callable[[Sequence[Any]], R], *extra: Any) -> Loader[R]:
    """The ``Loader`` of ``model``'s table (``host_id``, joined with ``leases``): each row made by
    ``make`` from (host, reservation, lease, project, ``extra`` columns..., start, end), the
    times as ``lease_text``."""
    columns = (
        model.host_id,
        model.reservation_id,
        model.lease_id,
        Lease.project_id,
        *extra,
        iso_text(model.start_date),
        iso_text(model.end_date),
    )

    def load(
        session: Session,
        after: dt.datetime,
        reservation_ids: Collection[str] | None,
        host_ids: Collection[int],
    ) -> list[R]:
        query = (
            select(*columns)
            .join(Lease, Lease.id == model.lease_id)
            .where(Lease.deleted_at.is_(None), model.end_date > after)
        )
        if reservation_ids is not None:
            among_these = []
            if reservation_ids:
                among_these.append(among(model.reservation_id, reservation_ids))
            if host_ids:
                among_these.append(model.host_id.in_(sorted(host_ids)))
            if not among_these:
                return []
            query = query.where(or_(*among_these))
        return [make(row) for row in session.connection().execute(query).all()]

    return load


def order(row: Shown) -> tuple[str, str]:
    """How a listing orders a resource's rows: by start, then reservation."""
    return row.start_date, row.reservation_id
