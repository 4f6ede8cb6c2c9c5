"""This process's in-memory calendar of one allocation table, kept in step with the database.

Admission asks it what is busy around a window instead of scanning the allocations (of hosts in
``host_allocations``, of one kind of item in ``item_allocations``: an ``AllocationStore``). It is
only changed under the admission lock, whose version numbers every committed change: before
use, the cache reloads just the reservations logged in ``allocation_changes`` since the version
it reflects (other processes' admissions; on PostgreSQL usually told by the change feed,
``db/change_feed.py``, without reading the log), or everything if the log no longer reaches back.
Changes made in a transaction are applied at once and undone if it rolls back. In the lock's
shared mode (``db/locking.py``) several admissions of this process may have booked here at once,
each in its own reservation; their changes are logged under the version their commit takes.

The log is shared by every calendar: reservation ids are unique across resource types, so a
calendar catching up drops the changed reservations it holds and reloads those its store has.

It also knows whose the allocations are (each reservation's lease, each lease's project and user,
which never change), so that an admission's usage rules read what a project holds from memory
(``held``) rather than with a range scan.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from climate.db import allocations as allocation_rows
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db import leases as lease_rows
from climate.db import locking
from climate.db.engine import CHANGED, Database, overlap_refused
from climate.planner.calendar import Calendar, FloatArray, HostSet, IntArray, Span, seconds
from climate.planner.hosts import HostsView
from climate.planner.instance_uses import HostUse, InstanceUses

LOG = logging.getLogger(__name__)

# Allocations that ended this long before the cache was loaded are left out of it.
HISTORY = dt.timedelta(days=30)
_DAY = 86_400.0
Owned = tuple[str, str, int, float, float, bool]
"""An allocation as ``CalendarCache.held`` gives it: lease id, user id, host, start and end in
seconds since the epoch, and whether it was read as the user's (else as the project's)."""
SYNCED = "calendar_synced"
STALE = "calendar_stale"


def _span(row: host_rows.SpanRow) -> Span:
    return Span(row.host_id, seconds(row.start), seconds(row.end), row.reservation_id)


def _usage_spans(host_id: int, uses: Iterable[HostUse]) -> list[Span]:
    """A host's instance uses as busy spans of the whole-host calendar: the union of their
    windows (merged, so they never overlap), owned by ``usage_owner(host)``."""
    owner = instance_rows.usage_owner(host_id)
    merged: list[Span] = []
    for use in sorted(uses, key=lambda u: u.start):
        last = merged[-1] if merged else None
        if last is not None and use.start <= last.end:
            if use.end > last.end:
                merged[-1] = Span(host_id, last.start, use.end, owner)
        else:
            merged.append(Span(host_id, use.start, use.end, owner))
    return merged


def _spans(loaded: host_rows.Loaded) -> dict[str, list[Span]]:
    """What ``loaded`` holds as spans, by owner (a host's instance usage's too)."""
    found: dict[str, list[Span]] = {}
    for row in loaded.spans:
        found.setdefault(row.reservation_id, []).append(_span(row))
    for host_id, uses in (loaded.uses or {}).items():
        found[instance_rows.usage_owner(host_id)] = _usage_spans(host_id, uses)
    return found


class AllocationStore(Protocol):
    """An allocation table whose rows never overlap per resource (its integer id)."""

    name: str

    def spans_since(self, session: Session, since: dt.datetime) -> host_rows.Loaded: ...

    def spans_of(self, session: Session, reservation_ids: Collection[str]) -> host_rows.Loaded: ...

    def replace(
        self,
        session: Session,
        reservation_id: str,
        lease_id: str,
        resource_ids: Iterable[int],
        start: dt.datetime,
        end: dt.datetime,
        *,
        fresh: bool = False,
        since: dt.datetime | None = None,
        starts: Mapping[int, dt.datetime] | None = None,
    ) -> Sequence[Any]: ...

    def truncate(self, session: Session, reservation_id: str, at: dt.datetime) -> None: ...


class HostAllocations:
    """``host_allocations`` as an ``AllocationStore``, with each host's instance usage as busy
    spans of a synthetic owner (``db.instances.usage_owner``): a host running instances in a
    window is not free to be reserved whole in it (docs/architecture.md)."""

    name = "hosts"

    def spans_since(self, session: Session, since: dt.datetime) -> host_rows.Loaded:
        uses: dict[int, list[HostUse]] = {}
        for use in instance_rows.uses_since(session, since):
            uses.setdefault(use.host_id, []).append(use)
        return host_rows.Loaded(host_rows.spans_since(session, since), uses)

    def spans_of(self, session: Session, reservation_ids: Collection[str]) -> host_rows.Loaded:
        """The allocations of ``reservation_ids``; for the owners that stand for a host's
        instance usage (``db.instances.usage_owner``), that host's instance uses."""
        hosts = {h for h in map(instance_rows.host_of_owner, reservation_ids) if h is not None}
        uses: dict[int, list[HostUse]] = {h: [] for h in hosts}
        since = dt.datetime.now(dt.UTC) - HISTORY  # what a load keeps: not years of history
        for use in instance_rows.uses_of(session, hosts, since) if hosts else ():
            uses[use.host_id].append(use)
        return host_rows.Loaded(host_rows.spans_of(session, reservation_ids), uses)

    def replace(
        self,
        session: Session,
        reservation_id: str,
        lease_id: str,
        resource_ids: Iterable[int],
        start: dt.datetime,
        end: dt.datetime,
        *,
        fresh: bool = False,
        since: dt.datetime | None = None,
        starts: Mapping[int, dt.datetime] | None = None,
    ) -> Sequence[Any]:
        return host_rows.replace_allocations(
            session,
            reservation_id,
            lease_id,
            resource_ids,
            start,
            end,
            fresh=fresh,
            since=since,
            starts=starts,
        )

    def truncate(self, session: Session, reservation_id: str, at: dt.datetime) -> None:
        host_rows.truncate_allocations(session, reservation_id, at)


class CalendarCache:
    def __init__(self, store: AllocationStore | None = None) -> None:
        self._store: AllocationStore = store or HostAllocations()
        self._synced = f"{SYNCED}:{self._store.name}"
        self._calendar = Calendar()
        self._uses = InstanceUses()
        self._version: int | None = None
        self._guard = threading.Lock()
        self._complete_after = math.inf  # every allocation ending after this is here
        self._lease_of: dict[str, str] = {}  # reservation -> lease
        self._owners: dict[str, tuple[str, str]] = {}  # lease -> project, user
        # project -> day its reservation's first span starts -> reservation -> lease, user
        self._filed: dict[str, dict[int, dict[str, tuple[str, str]]]] = {}
        # project -> the most time from a reservation's first start to its last end
        self._longest: dict[str, float] = {}
        self._filed_at: dict[str, tuple[str, int]] = {}  # reservation -> project, day
        self._unfiled: set[str] = set()  # reservations whose spans changed since filed

    # -- keeping in step ---------------------------------------------------------------------

    def sync(self, session: Session) -> None:
        """Bring the calendar up to the last committed admission before this transaction."""
        if Database.shares(session):
            self._sync_shared(session)
            return
        ours = self._lock_version(session)
        if not session.info.get(self._synced):
            stale = self._stale(session)
            if stale:
                # Loading now reads this transaction's uncommitted changes of those owners,
                # which no undo covers: if it rolls back, load everything again.
                self._on(session, "on_rollback", lambda: self._set_version(None))
            with self._guard:
                if self._version is None:
                    self._reload(session)
                elif self._version < ours - 1:
                    self._catch_up(session, self._version, ours - 1)
                self._version = ours - 1
            session.info[self._synced] = True
            # Owners marked stale after the last read are not in the calendar at commit: then
            # the next transaction catches up on this one's changes too.
            self._on(session, "on_commit", lambda: self._set_version(ours - bool(stale)))
        self._refresh_stale(session)

    def _sync_shared(self, session: Session) -> None:
        """A shared admission's sync (``db/locking.py``): up to the last commit numbered. The
        exclusive holders' changes are all in it (the mode waited for them); shared holders
        committing meanwhile only book resources this one will lock before it books them."""
        if session.info.get(self._synced):
            return
        self._catch_up_to(session, lease_rows.admission_version(session))
        session.info[self._synced] = True
        self._on(session, "on_commit", lambda: self._numbered(session.info["lock_version"]))

    def _catch_up_to(self, session: Session, committed: int) -> None:
        with self._guard:
            if self._version is None:
                self._reload(session)
            elif self._version < committed:
                self._catch_up(session, self._version, committed)
            else:
                return
            self._version = committed

    def _numbered(self, version: int) -> None:
        """This process committed ``version``, which the calendar shows already."""
        with self._guard:
            if self._version == version - 1:
                self._version = version

    @contextlib.contextmanager
    def reading(self, session: Session) -> Iterator[Calendar]:
        """The calendar, brought up to at least the last admission committed before ``session``
        read the lock's version, and held still while the caller reads it (an admission of this
        process waits to change it). Takes no admission lock: for searches in a reader session.
        It may include an admission of this process that has not committed yet."""
        self._catch_up_to(session, lease_rows.admission_version(session))
        with self._guard:
            yield self._calendar

    def _catch_up(self, session: Session, version: int, upto: int) -> None:
        changed = allocation_rows.changes_since(session, version, upto)
        if changed is None:
            self._reload(session)
            return
        for owner in changed:
            self._calendar.drop_owner(owner)
        loaded = self._store.spans_of(session, changed)
        for spans in _spans(loaded).values():
            for span in spans:
                self._calendar.add(span)
        for row in loaded.spans:
            self._note(row.reservation_id, row.lease_id)
        for host_id, uses in (loaded.uses or {}).items():
            self._uses.replace_host(host_id, uses)

    def _reload(self, session: Session) -> None:
        since = dt.datetime.now(dt.UTC) - HISTORY
        loaded = self._store.spans_since(session, since)
        self._calendar = Calendar.of(s for spans in _spans(loaded).values() for s in spans)
        self._uses = InstanceUses(u for uses in (loaded.uses or {}).values() for u in uses)
        self._complete_after = seconds(since)
        self._lease_of, self._filed, self._filed_at, self._longest = {}, {}, {}, {}
        self._unfiled = set()
        for row in loaded.spans:
            self._note(row.reservation_id, row.lease_id)

    def _note(self, reservation_id: str, lease_id: str) -> None:
        """``reservation_id`` of ``lease_id`` has spans here (called holding the guard)."""
        if lease_id:
            self._lease_of[reservation_id] = lease_id
            self._unfiled.add(reservation_id)

    def _set_version(self, version: int | None) -> None:
        with self._guard:
            self._version = version

    @staticmethod
    def mark_stale(session: Session, store: str, owners: Collection[str]) -> None:
        """Another resource type changed what ``owners`` hold in ``store``'s calendar (a host's
        instance usage): log it for other processes, and for this process's calendar, which
        reloads them when next read in this transaction, or else in the next one."""
        allocation_rows.record_changes(session, CalendarCache._lock_version(session), owners)
        session.info.setdefault(f"{STALE}:{store}", set()).update(owners)

    def _stale(self, session: Session) -> set[str]:
        found: set[str] = session.info.setdefault(f"{STALE}:{self._store.name}", set())
        return found

    def _refresh_stale(self, session: Session) -> None:
        stale = self._stale(session)
        if not stale:
            return
        owners = sorted(stale)
        stale.clear()
        self._take(session, owners, log=False)

    @staticmethod
    def _lock_version(session: Session) -> int:
        version = session.info.get("lock_version")
        if version is None:
            raise RuntimeError("allocations change only under the admission lock")
        return int(version)

    @staticmethod
    def _on(session: Session, key: str, action: Callable[[], None]) -> None:
        session.info.setdefault(key, []).append(action)

    # -- reading and writing -----------------------------------------------------------------

    def view(
        self,
        session: Session,
        hosts: HostSet,
        start: dt.datetime,
        end: dt.datetime,
        exclude: Sequence[str] = (),
    ) -> HostsView:
        self.sync(session)
        return self._calendar.view(hosts, start, end, exclude, host_rows.LOOKAROUND.total_seconds())

    def overlapping(
        self, session: Session, host_id: int, start: dt.datetime, end: dt.datetime
    ) -> list[Span]:
        """The allocations of ``host_id`` overlapping [start, end) (re-optimisation reads the
        calendar host by host)."""
        self.sync(session)
        return self._calendar.overlapping(host_id, seconds(start), seconds(end))

    def taken(
        self,
        session: Session,
        hosts: HostSet,
        start: dt.datetime,
        end: dt.datetime,
        exclude: Sequence[str] = (),
    ) -> tuple[FloatArray, FloatArray, IntArray]:
        """The allocations of ``hosts`` overlapping [start, end), but those of ``exclude``
        (``Calendar.taken``)."""
        self.sync(session)
        return self._calendar.taken(hosts, seconds(start), seconds(end), exclude)

    @property
    def uses(self) -> InstanceUses:
        """The hosts' instance uses, in step with the calendar: read them where the calendar is
        read (inside ``reading``, or after ``synced`` under the admission lock)."""
        return self._uses

    def synced(self, session: Session) -> Calendar:
        """The calendar, synced once for a search that reads many hosts in a row and changes
        nothing until it is done (re-optimisation): its reads then skip the sync."""
        self.sync(session)
        return self._calendar

    def replace(
        self,
        session: Session,
        reservation_id: str,
        lease_id: str,
        host_ids: Sequence[int],
        start: dt.datetime,
        end: dt.datetime,
        *,
        fresh: bool = False,
        since: dt.datetime | None = None,
        starts: Mapping[int, dt.datetime] | None = None,
    ) -> list[Any]:
        """Give ``reservation_id`` exactly ``host_ids`` (or items) over [start, end), in the
        database and here (``fresh``: it holds nothing yet); returns its allocations.
        ``since``: it runs and is changed then (``db.allocations.replace``: its past stays, what
        it gains is held from ``since``).

        :raises locking.Contended: a shared admission (``db/locking.py``) chose a resource
            another transaction holds, or the database refused an overlap (PostgreSQL's
            exclusion constraint): the caller admits again, alone, on a calendar caught up.
        """
        self.sync(session)
        if Database.shares(session) and not locking.try_resources(
            session, self._store.name, host_ids
        ):
            raise locking.Contended(f"{self._store.name} {sorted(host_ids)}: booked meanwhile")
        try:
            rows = list(
                self._store.replace(
                    session,
                    reservation_id,
                    lease_id,
                    host_ids,
                    start,
                    end,
                    fresh=fresh,
                    since=since,
                    starts=starts,
                )
            )
        except IntegrityError as error:
            if not overlap_refused(error):
                raise
            self._overlap_refused(session, host_ids)
            refused = f"{self._store.name} {sorted(host_ids)}: {error.orig}"
            raise locking.Contended(refused) from error
        if since is not None:  # rows of their own dates: as the database now has them
            self._take(session, [reservation_id], log=True)
            return rows
        new = [Span(h, seconds(start), seconds(end), reservation_id) for h in host_ids]
        self._swap(session, reservation_id, new, lease_id=lease_id)
        return rows

    def _overlap_refused(self, session: Session, ids: Sequence[int]) -> None:
        """The database's exclusion constraint refused this transaction's booking of ``ids``. In
        the shared mode another admission committed one of them after the sync: the exclusive
        mode catches up on it. In the exclusive mode this calendar missed a committed change:
        it is loaded again from the database once the transaction has rolled back."""
        if Database.shares(session):
            return
        LOG.warning(
            "%s calendar missed a committed booking of %s: loading it again", self._store.name, ids
        )
        self._on(session, "on_rollback", lambda: self._set_version(None))

    def truncate(self, session: Session, reservation_id: str, at: dt.datetime) -> None:
        """End the reservation's allocations at ``at``, in the database and here."""
        self.sync(session)
        self._store.truncate(session, reservation_id, at)
        self.reread(session, [reservation_id])

    def reread(self, session: Session, reservation_ids: Collection[str]) -> None:
        """Take these reservations' allocations as this transaction wrote them (healing moves
        single rows, services/healing.py), here and, through the log, in other processes."""
        self.sync(session)
        self._take(session, reservation_ids, log=True)

    def _take(self, session: Session, owners: Collection[str], *, log: bool) -> None:
        """Read ``owners``' allocations as this transaction sees them, in place of theirs here
        (put back if it rolls back)."""
        loaded = self._store.spans_of(session, list(owners))
        found = _spans(loaded)
        leases = {row.reservation_id: row.lease_id for row in loaded.spans}
        for owner in owners:
            spans = found.get(owner, [])
            self._swap(session, owner, spans, log=log, lease_id=leases.get(owner, ""))
        for host_id, uses in (loaded.uses or {}).items():
            with self._guard:
                old = self._uses.replace_host(host_id, uses)
            self._on(session, "on_rollback", self._putting_back(host_id, old))

    def _putting_back(self, host_id: int, uses: list[HostUse]) -> Callable[[], None]:
        def undo() -> None:
            with self._guard:
                self._uses.replace_host(host_id, uses)

        return undo

    def _swap(
        self,
        session: Session,
        reservation_id: str,
        new: list[Span],
        *,
        log: bool = True,
        lease_id: str = "",
    ) -> None:
        if log and Database.shares(session):
            session.info.setdefault(CHANGED, set()).add(reservation_id)
        elif log:
            allocation_rows.record_changes(session, self._lock_version(session), [reservation_id])
        with self._guard:
            old = self._calendar.drop_owner(reservation_id)
            for span in new:
                self._calendar.add(span)
            self._note(reservation_id, lease_id)

        def undo() -> None:
            with self._guard:
                self._calendar.drop_owner(reservation_id)
                for span in old:
                    self._calendar.add(span)
                self._note(reservation_id, self._lease_of.get(reservation_id, ""))

        self._on(session, "on_rollback", undo)

    # -- whose allocations -------------------------------------------------------------------

    def held(
        self,
        session: Session,
        project_id: str,
        user_id: str,
        mine: tuple[float, float],
        ours: tuple[float, float] | None,
        lease: tuple[str, str, str] | None = None,
    ) -> list[Owned] | None:
        """The allocations of ``user_id``'s leases in ``project_id`` overlapping ``mine`` and,
        unless None, of all the project's leases overlapping ``ours`` (a row of the user's in
        both ranges comes twice), deleted leases too: ``db/usage.held``'s rows for whole
        hosts, from memory. ``lease``: the id, project and user of a lease this transaction
        wrote.

        None when the calendar cannot tell: it holds every allocation the transaction sees only
        once synced under the admission lock in its exclusive mode (an admission's own
        transaction), and none that ended long before it was loaded (``HISTORY``).
        """
        if not session.info.get(self._synced) or Database.shares(session):
            return None
        if min(mine[0], mine[0] if ours is None else ours[0]) < self._complete_after:
            return None
        with self._guard:
            if lease is not None:
                self._owners.setdefault(lease[0], (lease[1], lease[2]))
            if self._unfiled and not self._file(session):
                return None
            by_owner = self._calendar.by_owner
            low, high = mine if ours is None else (min(mine[0], ours[0]), max(mine[1], ours[1]))
            first = (low - self._longest.get(project_id, 0.0)) // _DAY
            last = high // _DAY
            found: list[Owned] = []
            for day, members in self._filed.get(project_id, {}).items():
                if not first <= day <= last:
                    continue  # every span of theirs ended before, or starts after, both ranges
                for reservation_id, (lease_id, user) in members.items():
                    own = user == user_id
                    for host, start, end in by_owner.get(reservation_id, ()):
                        if own and start < mine[1] and end > mine[0]:
                            found.append((lease_id, user, host, start, end, True))
                        if ours is not None and start < ours[1] and end > ours[0]:
                            found.append((lease_id, user, host, start, end, False))
            return found

    def _file(self, session: Session) -> bool:
        """File the reservations whose spans changed under their leases' projects, by the day
        their first span starts (reading the leases not known yet); False if one that holds
        spans has no lease to be found."""
        by_owner = self._calendar.by_owner
        missing = {
            lease_id
            for r in self._unfiled
            if (lease_id := self._lease_of[r]) not in self._owners and r in by_owner
        }
        if missing:
            self._owners.update(lease_rows.owners(session, missing))
        for reservation_id in list(self._unfiled):
            before = self._filed_at.pop(reservation_id, None)
            if before is not None:
                days = self._filed[before[0]]
                del days[before[1]][reservation_id]
                if not days[before[1]]:
                    del days[before[1]]
            spans = by_owner.get(reservation_id)
            lease_id = self._lease_of[reservation_id]
            known = self._owners.get(lease_id)
            if spans and known is not None:
                project, begin = known[0], min(start for _, start, _ in spans)
                day = int(begin // _DAY)
                self._filed.setdefault(project, {}).setdefault(day, {})[reservation_id] = (
                    lease_id,
                    known[1],
                )
                self._filed_at[reservation_id] = (project, day)
                longest = max(end for _, _, end in spans) - begin
                if longest > self._longest.get(project, 0.0):
                    self._longest[project] = longest
            elif spans:
                continue  # its lease is not to be found: stays unfiled
            # Filed, or it holds nothing (noted again if it gets spans back).
            self._unfiled.discard(reservation_id)
        if self._unfiled:
            return False
        # A set keeps the table of its largest size: once a load filed every reservation, each
        # admission's walk of the one it files would step through thousands of empty slots.
        self._unfiled.clear()
        return True
