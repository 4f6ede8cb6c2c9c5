"""A page of leases for a caller that keeps what it showed: each lease comes with the revision
of its rows, and is loaded only if the caller does not keep it at that revision.

A listing answers every live lease of a page (all of them without ``limit``), so loading each
one made its cost grow with the leases stored. Where the database counts each lease's revisions
(``lease_revisions``, kept by SQLite's triggers in the transaction of every change), a page is
read as (id, status, revision) first, from the page kept and brought up to date
(``db/lease_pages.py``); a lease the caller keeps at that revision (and queue place) is not
loaded again. What a caller keeps came from a committed snapshot (a reader's), and a committed
revision is never seen again with other rows: every change moves it. Without the triggers
(PostgreSQL) every lease of the page is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.orm import Session

from climate.context import FIRST_PAGE, Page
from climate.db import lease_views
from climate.db import leases as lease_rows
from climate.domain.actor import Actor
from climate.domain.status import LeaseStatus
from climate.domain.views import LeaseView
from climate.errors import NotFound
from climate.services.leases.base import LeaseBase

T = TypeVar("T")


@dataclass(slots=True)
class Shown(Generic[T]):
    """A lease of a page: what the caller keeps of it, or the lease loaded. (Not frozen: a
    listing makes a thousand, and a frozen dataclass sets each field through
    ``object.__setattr__``, four times as slow.)"""

    id: str
    revision: int | None
    """None: the database does not count revisions."""
    place: int | None
    """Its place in the waiting queue, from 1 (None: it does not wait)."""
    kept: T | None
    lease: LeaseView | None


class Listing(LeaseBase):
    def list_revised(
        self,
        actor: Actor,
        kept: Callable[[str, int, int | None], T | None],
        *,
        project_id: str | None = None,
        status: str | None = None,
        name: str | None = None,
        page: Page = FIRST_PAGE,
    ) -> list[Shown[T]]:
        """``list_all``'s leases with their queue places; one that ``kept(id, revision,
        place)`` answers for is not loaded.

        :raises InvalidInput: ``marker`` is not a lease of this listing, or a bad ``sort_key``.
        """
        with self.ctx.db.reader() as session:
            asked = self._listing(session, actor, project_id, status, name, page)
            if asked is None:
                return []
            listed = self.pages.page(session, asked)
            if listed is None:
                leases = lease_views.live_page(session, asked)
                places = _places(session, (lease.status for lease in leases))
                return [Shown(x.id, None, places.get(x.id), None, x) for x in leases]
            places = _places(session, (lease.status for lease in listed))
            shown: list[Shown[T]] = []
            for x in listed:
                place = places.get(x.id)
                shown.append(Shown(x.id, x.revision, place, kept(x.id, x.revision, place), None))
            missing = [x.id for x in shown if x.kept is None]
            if not missing:
                return shown
            loaded = lease_views.by_ids(session, missing)
        return [
            x if x.kept is not None else Shown(x.id, x.revision, x.place, None, loaded[x.id])
            for x in shown
        ]

    def get_revised(
        self, actor: Actor, lease_id: str, kept: Callable[[str, int, int | None], T | None]
    ) -> Shown[T]:
        """``get``'s lease with its queue place, not loaded if ``kept(id, revision, place)``
        answers for it.

        :raises NotFound: no such live lease, or another project's.
        :raises Forbidden: the policy does not let the caller see it.
        """
        with self.ctx.db.reader() as session:
            if not lease_views.counts(session):
                lease = self._load(session, actor, lease_id, "blazar:leases:get")
                places = _places(session, [lease.status])
                return Shown(lease.id, None, places.get(lease.id), None, lease)
            found = lease_views.revision_of(session, lease_id, self.ctx.policy.scope(actor))
            if found is None:
                raise NotFound("Lease", lease_id, "lease_id")
            owners = {"project_id": found.project_id, "user_id": found.user_id}
            self.ctx.policy.enforce(actor, "blazar:leases:get", owners)
            place = _places(session, [found.status]).get(found.id)
            rendered = kept(found.id, found.revision, place)
            if rendered is not None:
                return Shown(found.id, found.revision, place, rendered, None)
            record = lease_views.by_ids(session, [found.id])[found.id]
        return Shown(found.id, found.revision, place, None, record)


def _places(session: Session, statuses: Iterable[str]) -> dict[str, int]:
    """The queue's places, when a lease of the page waits in it."""
    if any(status == LeaseStatus.IN_PROGRESS for status in statuses):
        return lease_rows.queue_places(session)
    return {}
