"""Admission's locks on PostgreSQL below the ``locks`` row: transaction-scoped advisory locks.

Two modes share one key. Most writers of capacity take it exclusively, then the ``locks`` row,
as every admission once did (``Database.lock``). A new lease whose resources are booked one
resource at a time (``ResourceType.books_per_resource``: whole hosts) takes it shared
(``Database.transaction(shared=True)``, then ``Database.lock``): such admissions run side by
side, each locking only what it chose, in a lock order that cannot close a cycle:

1. the mode, shared (an exclusive holder, say a repack moving other leases, waits for every
   shared holder to end, and new ones wait behind it);
2. the resources chosen, without waiting (``try_resources``: another admission holding one
   means the plan was made on a calendar that did not show it yet);
3. the owners the usage rules count (``owners``: project, then user, waiting, sorted);
4. the ``locks`` row, last, only to number the commit (``Database`` does it before commit).

The database stays the final guard: ``host_allocations`` has an exclusion constraint, whose
refusal ``CalendarCache.replace`` raises as ``Contended`` (docs/architecture.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.orm import Session

from climate.db import raw


class Contended(Exception):
    """Another transaction booked, or is booking, a resource this shared admission chose: the
    caller runs the admission again in the exclusive mode, on a calendar caught up."""


_MODE = (0x434C, 0)
"""The admission mode's key ("CL", 0)."""
_OWNERS = 0x434D
"""The class of the usage rules' owners' keys ("CM", a hash of the project or user id)."""

_EXCLUSIVE = text("SELECT pg_advisory_xact_lock(:a, :b)")
_SHARED = text("SELECT pg_advisory_xact_lock_shared(:a, :b)")
_TRY = text(
    "SELECT bool_and(pg_try_advisory_xact_lock(:a, r)) FROM unnest(CAST(:ids AS integer[])) AS r"
)
_OWNERS_IN_ORDER = text(
    "SELECT count(pg_advisory_xact_lock(:a, hashtext(k)))"
    " FROM (SELECT k FROM unnest(CAST(:keys AS text[])) AS k ORDER BY k) AS s"
)


def exclusive(session: Session) -> None:
    """Take the admission mode alone, waiting for every shared holder to end."""
    raw.rows(session, _EXCLUSIVE, {"a": _MODE[0], "b": _MODE[1]})


def shared(session: Session) -> None:
    """Take the admission mode beside other shared holders."""
    raw.rows(session, _SHARED, {"a": _MODE[0], "b": _MODE[1]})


def try_resources(session: Session, store: str, ids: Iterable[int]) -> bool:
    """Lock these resources of ``store`` (an allocation table's calendar) for the rest of the
    transaction; False, at once, if another transaction holds any of them."""
    wanted = sorted(ids)
    if not wanted:
        return True
    found = raw.rows(session, _TRY, {"a": _store_class(store), "ids": wanted})
    return bool(found[0][0])


def owners(session: Session, keys: Iterable[str]) -> None:
    """Lock the usage rules' owners (a project's and a user's ids), waiting, in sorted order."""
    raw.rows(session, _OWNERS_IN_ORDER, {"a": _OWNERS, "keys": sorted(set(keys))})


def _store_class(store: str) -> int:
    # Signed 32 bits, as advisory keys are; distinct from the mode's and the owners' classes.
    return zlib.crc32(store.encode()) % 0x3FFF_FFFF + 0x4000_0000
