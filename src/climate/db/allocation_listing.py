"""The host allocations a listing shows, kept in memory per host and in step with the database.

``GET /v1/os-hosts/allocations`` shows every host's allocations from now on: thousands of rows
read, made into tuples and grouped on each call, the same rows from one call to the next. This
keeps them per host and catches up as the calendars do (``calendar_cache``): the admission
version numbers every committed change of an allocation table (allocations change only under
the admission lock), and ``allocation_changes`` names the reservations each change touched.
Those are read again; the rest is kept. Each host carries a stamp that moves whenever its rows
change, so that a caller can keep what it made of a host's rows (their JSON:
``api/allocation_renders.py``).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Collection, Sequence

from sqlalchemy.orm import Session

from climate.db import allocations as allocation_rows
from climate.db import hosts as host_rows
from climate.db import leases as lease_rows
from climate.db.hosts import ListedRow

RELOAD_AFTER = dt.timedelta(hours=6)
"""How long rows are kept before everything is read again: the rows that ended meanwhile go."""
_MARGIN = dt.timedelta(minutes=5)
"""How far before the load the rows go back: listings from a moment ago are answered too."""


def lease_text(value: dt.datetime) -> str:
    """A time as the allocation listings show it, and compare it as text: naive UTC ISO 8601
    with microseconds (``types.iso_text``)."""
    return value.astimezone(dt.UTC).replace(tzinfo=None).isoformat("T", "microseconds")


class HostAllocationListing:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._version: int | None = None
        self._loaded_at = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._horizon = ""  # rows that end at or before this (lease text) are not kept
        self._of: dict[str, list[ListedRow]] = {}  # reservation -> its rows
        self._hosts: dict[int, list[ListedRow]] = {}  # by start, then reservation
        self._stamps: dict[int, int] = {}
        self._stamped = 0

    def per_host(
        self, session: Session, host_ids: Sequence[int], since: dt.datetime, now: dt.datetime
    ) -> list[tuple[int, int, Sequence[ListedRow]]] | None:
        """Each of ``host_ids`` with its stamp and its rows as committed when ``session``
        began (or later), those ending after ``since`` among them only as far as the caller
        filters; None when ``since`` is before what is kept."""
        since_text = lease_text(since)
        version = lease_rows.admission_version(session)
        with self._guard:
            if self._version is None or now - self._loaded_at > RELOAD_AFTER:
                self._reload(session, now)
            elif self._version < version:
                changed = allocation_rows.changes_since(session, self._version)
                if changed is None:
                    self._reload(session, now)
                else:
                    self._reread(session, changed)
            self._version = max(self._version or 0, version)
            if since_text < self._horizon:
                return None
            none: Sequence[ListedRow] = ()
            return [(h, self._stamps.get(h, 0), self._hosts.get(h, none)) for h in host_ids]

    def _reload(self, session: Session, now: dt.datetime) -> None:
        after = now - _MARGIN
        rows = host_rows.listed_allocations(session, after)
        self._of, self._hosts = {}, {}
        for row in rows:
            self._of.setdefault(row.reservation_id, []).append(row)
            self._hosts.setdefault(row.host_id, []).append(row)
        for kept in self._hosts.values():
            kept.sort(key=_order)
        self._stamped += 1
        self._stamps = dict.fromkeys(self._hosts, self._stamped)
        self._loaded_at, self._horizon = now, lease_text(after)

    def _reread(self, session: Session, changed: Collection[str]) -> None:
        after = dt.datetime.fromisoformat(self._horizon).replace(tzinfo=dt.UTC)
        touched: set[int] = set()
        for reservation_id in changed:
            for row in self._of.pop(reservation_id, ()):
                self._hosts[row.host_id].remove(row)
                touched.add(row.host_id)
        for row in host_rows.listed_allocations(session, after, changed):
            self._of.setdefault(row.reservation_id, []).append(row)
            self._hosts.setdefault(row.host_id, []).append(row)
            touched.add(row.host_id)
        self._stamped += 1
        for host in touched:
            self._hosts[host].sort(key=_order)
            self._stamps[host] = self._stamped


def _order(row: ListedRow) -> tuple[str, str]:
    return row.start_date, row.reservation_id
