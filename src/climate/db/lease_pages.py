"""The pages of leases a listing process showed last, kept and brought up to date from the
leases changed since, instead of read again.

A page (``lease_views.revisions``) is up to ``limit`` leases (all without it), each with its
status and revision: reading it cost a row per lease, a thousand for a page of a thousand, and
more of the listing's time than anything else as the leases stored grew. Where the database counts
revisions (SQLite's triggers), every change to a lease also takes the next number of one
sequence (migration 0026); a kept page remembers the number it was read at, and the next
listing reads only the leases changed after it (``lease_views.changed_since``). Those update
the page: a lease that changed in place, one that enters it, one that leaves it (a full page
then takes the next ones after its last lease, read alone). A lease that moves in the order, or
too many changed, and the page is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from climate.db import lease_views
from climate.db.lease_views import Asked, Changed, Listed

KEPT_PAGES = 32
"""Pages kept (least recently listed dropped first): one is about 150 KB at a thousand leases."""
MOST_CHANGES = 256
"""Changed leases read to bring a page up to date; with more, the page is read again."""


@dataclass(frozen=True)
class _Kept:
    seq: int
    """``lease_views.last_change`` when these were the page."""
    leases: Sequence[Listed]


class LeasePages:
    """The pages this process listed last, by what was asked."""

    def __init__(self) -> None:
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()
        self._lock = threading.Lock()

    def page(self, session: Session, asked: Asked) -> Sequence[Listed] | None:
        """``lease_views.revisions(session, asked)``: from the page kept, brought up to date
        where it can be; None where the database does not count revisions."""
        if not lease_views.counts(session):
            return None
        key = _key(asked)
        seq = lease_views.last_change(session)
        with self._lock:
            kept = self._kept.get(key)
        leases: Sequence[Listed] | None = None
        # A kept page newer than this reader's snapshot is not its page.
        if kept is not None and kept.seq <= seq:
            if kept.seq == seq:
                return kept.leases
            changed = lease_views.changed_since(session, kept.seq, asked.sort_key, MOST_CHANGES)
            if changed is not None:

                def after(last: Listed, count: int) -> Sequence[Listed]:
                    return lease_views.revisions_after(session, asked, last, count)

                leases = advanced(kept.leases, changed, asked, after)
        if leases is None:
            leases = lease_views.revisions(session, asked)
            assert leases is not None  # the database counts revisions
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.seq <= seq:
                self._kept[key] = _Kept(seq, leases)
                self._kept.move_to_end(key)
                while len(self._kept) > KEPT_PAGES:
                    self._kept.popitem(last=False)
        return leases


def advanced(
    page: Sequence[Listed],
    changed: Sequence[Changed],
    asked: Asked,
    after: Callable[[Listed, int], Sequence[Listed]],
) -> list[Listed] | None:
    """The page ``asked`` once ``changed`` (every lease changed since ``page`` was read) are
    applied; None when that cannot be known without reading the page again. ``after(lease,
    count)`` reads the ``count`` leases of the listing that come after ``lease`` (as they are
    now): those that fill a full page that lost some."""
    limit = asked.limit
    full = limit is not None and len(page) >= limit
    at = {lease.id: i for i, lease in enumerate(page)}
    now: list[Listed | None] = list(page)
    entering: list[Listed] = []
    left = 0
    for lease in changed:
        i = at.get(lease.id)
        shown = _shown(lease, asked)
        if i is None:
            if shown:
                entering.append(Listed(lease.id, lease.status, lease.revision, lease.key))
        elif not shown:
            now[i] = None
            left += 1
        elif lease.key != page[i].key:
            return None
        else:
            now[i] = Listed(lease.id, lease.status, lease.revision, lease.key)
    leases = [lease for lease in now if lease is not None]
    if full:
        # Beyond the page's last lease, only the first ``left`` can come in (read as they are
        # now); those changed that fall there are among them or after them.
        last = page[-1]
        entering = [x for x in entering if _before(_order(x), _order(last), asked.descending)]
        if left:
            entering += after(last, left)
    if not entering:
        return leases
    leases += entering
    leases.sort(key=_order, reverse=asked.descending)
    return leases if limit is None else leases[:limit]


def _key(asked: Asked) -> Hashable:
    marker = asked.marker
    after = None if marker is None else (marker.id, getattr(marker, asked.sort_key))
    return (
        asked.project_id,
        asked.status,
        asked.name,
        asked.limit,
        after,
        asked.sort_key,
        asked.descending,
    )


def _order(lease: Listed | Changed) -> tuple[object, str]:
    return lease.key, lease.id


def _before(a: tuple[object, str], b: tuple[object, str], descending: bool) -> bool:
    """Whether ``a`` comes before ``b`` in the page's order (``keyset_order``)."""
    return a > b if descending else a < b


def _shown(lease: Changed, asked: Asked) -> bool:
    """Whether the lease belongs to the leases ``asked`` lists (wherever it falls)."""
    if not lease.live:
        return False
    if asked.project_id is not None and lease.project_id != asked.project_id:
        return False
    if asked.status is not None and lease.status != asked.status:
        return False
    if asked.name is not None and lease.name != asked.name:
        return False
    marker = asked.marker
    if marker is None:
        return True
    return _before((getattr(marker, asked.sort_key), marker.id), _order(lease), asked.descending)
