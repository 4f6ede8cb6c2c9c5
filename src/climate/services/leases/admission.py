"""The one "admit this shape" pipeline: every new lease, changed lease and lease served from the
queue books its reservations through ``book``, in a transaction run by ``attempt``.

Checks of a whole shape that need no more than it would go at the top of ``book``. Usage rules
need more (the actor, the step, the lease before a change): each use case judges its lease
right after ``book`` (``fairshare.admit``); their refusal, a ``UsageRuleBroken``, comes back on
the ``Refused`` value as it is. Refused demand is recorded by each use case once the refusal is
explained (``services.demand_record``): the record wants the actor, the request and the best
counter-offer, which ``attempt`` does not have.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy.orm import Session

from climate.context import ServiceContext
from climate.db.locking import Contended
from climate.db.tables import Reservation
from climate.domain.admission import Admitted, Refused
from climate.errors import Conflict, NotEnoughCapacity, UsageRuleBroken

T = TypeVar("T")
LOG = logging.getLogger(__name__)


def book(
    ctx: ServiceContext,
    session: Session,
    reservations: Iterable[Reservation],
    start: dt.datetime,
    end: dt.datetime,
    *,
    active: bool,
    now: dt.datetime,
) -> None:
    """Book ``reservations`` over [start, end) in the caller's transaction, which holds the
    admission lock; ``active``: the lease runs (its reservations keep what they hold).

    :raises NotEnoughCapacity: the shape does not fit; the caller's transaction must roll back.
    """
    # Hook: a check of the whole shape before anything is booked goes here.
    for reservation in reservations:
        ctx.resource_types[reservation.resource_type].admit(
            session, reservation, start, end, active=active, now=now
        )


def attempt(
    ctx: ServiceContext,
    write: Callable[[Session], T],
    *,
    lock: str | None = None,
    rollback: bool = False,
    shared: bool = False,
) -> Admitted[T] | Refused:
    """Run ``write`` (which books through ``book``) in a transaction of its own, committed, or
    rolled back with ``rollback`` (a dry run). A refusal comes back as a value once the
    transaction has rolled back; any other error is raised.

    ``shared``: every reservation ``write`` books is of a type that ``books_per_resource``. It
    is tried in the admission lock's shared mode first (``db/locking.py``), beside other such
    admissions; if it needs more (another transaction took a resource it chose, or only
    moving other leases would make room), it runs again alone.

    The database stays the final guard: alone, a booking it refuses (a calendar that missed a
    change) runs once more on a calendar loaded again, then is a ``Conflict``.

    :raises Conflict: the database refused the booking however the calendar was read.
    """
    modes = (False, True, True) if shared else (True, True)
    for tried, alone in enumerate(modes, 1):
        try:
            with ctx.db.transaction(lock=lock, rollback=rollback, shared=not alone) as session:
                written = write(session)
        except Contended as contended:
            if tried == len(modes):
                raise Conflict(f"the booking kept meeting another: {contended}") from contended
            LOG.debug("admitting alone: %s", contended)
            continue
        except NotEnoughCapacity as refused:
            broken = refused if isinstance(refused, UsageRuleBroken) else None
            return Refused(str(refused), broken)
        return Admitted(written)
    raise AssertionError("unreachable: the last mode returns or raises")
