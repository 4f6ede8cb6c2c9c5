"""What every lease use case shares: reading leases, and the rows that carry a lease's events,
notifications and audit records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from climate import inputs
from climate.context import FIRST_PAGE, Page, ServiceContext
from climate.db import audit, lease_views
from climate.db import leases as lease_rows
from climate.db.lease_pages import LeasePages
from climate.db.tables import NAME_LENGTH, Event, Lease, built, new_id
from climate.domain import lease_rules
from climate.domain.actor import Actor
from climate.domain.formats import duration
from climate.domain.requests import ReservationRequest
from climate.domain.status import (
    EVENT_ORDER,
    LIFECYCLE_ORDER,
    EventStatus,
    EventType,
    LeaseStatus,
)
from climate.domain.views import LeaseView
from climate.errors import InvalidInput, NotFound
from climate.notify import enqueue_lease
from climate.resources import pick


class LeaseBase:
    """The lease service's state and the helpers its use cases share."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.pages = LeasePages()
        """The lease pages this process listed last (``Listing.list_revised``)."""

    def get(self, actor: Actor, lease_id: str) -> Lease:
        with self.ctx.db.reader() as session:
            return self._load(session, actor, lease_id, "blazar:leases:get")

    def list_all(
        self,
        actor: Actor,
        *,
        project_id: str | None = None,
        status: str | None = None,
        name: str | None = None,
        page: Page = FIRST_PAGE,
    ) -> Sequence[LeaseView]:
        """Live leases of the caller's project (of every project, or the one asked for, to
        those the ``admin`` rule allows), a page at a time.

        :raises InvalidInput: ``marker`` is not a lease of this listing, or a bad ``sort_key``.
        """
        with self.ctx.db.reader() as session:
            asked = self._listing(session, actor, project_id, status, name, page)
            return [] if asked is None else lease_views.live_page(session, asked)

    def _listing(
        self,
        session: Session,
        actor: Actor,
        project_id: str | None,
        status: str | None,
        name: str | None,
        page: Page,
    ) -> lease_views.Asked | None:
        """The page ``actor`` asked for (None: nothing they may see).

        :raises InvalidInput: ``marker`` is not a lease of this listing, or a bad ``sort_key``.
        """
        self.ctx.policy.enforce(actor, "blazar:leases:get", actor.owner())
        scope = self.ctx.policy.scope(actor)
        if scope is not None:
            if project_id not in (None, scope):
                return None
            project_id = scope
        sort_key = page.key(lease_rows.LEASE_SORT_KEYS)
        marker = None
        if page.marker is not None:
            marker = lease_rows.get(session, page.marker, project_id=scope)
            if marker is None:
                raise InvalidInput("marker", "not the id of a lease in this listing")
        return lease_views.Asked(
            project_id,
            status,
            name,
            page.blazar_size(self.ctx.settings.max_page_size),
            marker,
            sort_key,
            page.sort_dir == "desc",
        )

    def _load(
        self, session: Session, actor: Actor, lease_id: str, rule: str, *, locked: bool = False
    ) -> Lease:
        """The lease if the caller may see it and ``rule`` allows the action on it. Another
        project's lease is not found (404, not 403): its existence is not given away.
        ``locked``: see ``lease_rows.get``."""
        scope = self.ctx.policy.scope(actor)
        lease = lease_rows.get(session, lease_id, project_id=scope, locked=locked)
        if lease is None:
            raise NotFound("Lease", lease_id, "lease_id")
        self.ctx.policy.enforce(
            actor, rule, {"project_id": lease.project_id, "user_id": lease.user_id}
        )
        return lease

    def _type_of(self, request: ReservationRequest, field: str) -> Any:
        return pick(self.ctx.resource_types, request.resource_type, f"{field}.resource_type")

    def _before_end(
        self,
        given: dt.datetime | None,
        start: dt.datetime,
        end: dt.datetime,
        offset: dt.timedelta | None = None,
    ) -> dt.datetime:
        default = dt.timedelta(minutes=self.ctx.settings.minutes_before_end_lease)
        return lease_rules.before_end(given, start, end, offset, default)

    @property
    def _retry_interval(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.ctx.settings.retry_interval_seconds)

    def _freed(self, session: Session, now: dt.datetime) -> None:
        """Capacity freed: wake the manager if leases wait for it."""
        if lease_rows.queue_waits(session):
            self.ctx.events_changed(session, now)

    def _notify(
        self,
        session: Session,
        topic: str,
        lease: Lease,
        now: dt.datetime,
        event_type: str | None = None,
    ) -> None:
        enqueue_lease(session, self.ctx.settings, topic, lease, now, event_type)


def new_events(
    lease: Lease, now: dt.datetime, reminders: Sequence[dt.timedelta] = ()
) -> list[Event]:
    """The rows of a lease's event plan (``lease_rules.event_plan``)."""
    plan = lease_rules.event_plan(
        lease.start_date, lease.end_date, lease.before_end_date, reminders
    )
    return [
        reminder(lease.id, p.time, now) if p.reminder else event(lease.id, p.kind, p.time, now)
        for p in plan
    ]


def reminder(lease_id: str, when: dt.datetime, now: dt.datetime) -> Event:
    """A reminder: a before-end event that only notifies. One whose time has passed is
    recorded as skipped: DONE without an attempt."""
    row = event(lease_id, EventType.BEFORE_END_LEASE, when, now)
    row.priority = lease_rows.REMINDER_PRIORITY
    if when < now:
        row.status = EventStatus.DONE
    return row


def event(lease_id: str, kind: EventType, when: dt.datetime, now: dt.datetime) -> Event:
    return built(
        Event,
        id=new_id(),
        lease_id=lease_id,
        event_type=kind,
        time=when,
        not_before=when,
        priority=EVENT_ORDER[kind],
        seq=LIFECYCLE_ORDER[kind],
        status=EventStatus.UNDONE,
        attempts=0,
        last_error=None,
        claimed_by=None,
        claimed_until=None,
        done_at=None,
        created_at=now,
        updated_at=None,
    )


def started(lease: Lease, held: Sequence[Event]) -> bool:
    """Whether the lease has started, or a manager is starting it: its status has moved on, or
    its start is not among its waiting events, ``held`` by this transaction (a manager took it
    and will write ACTIVE, even if the lease still shows PENDING). Waiting and held leases
    have no events and have not started."""
    if lease.status in (LeaseStatus.IN_PROGRESS, LeaseStatus.HELD):
        return False
    return lease.status != LeaseStatus.PENDING or all(
        e.event_type != EventType.START_LEASE for e in held
    )


def window(lease: Lease) -> dict[str, object]:
    """A lease's name and dates, as its audit records compare them."""
    shown: dict[str, object] = {
        "name": lease.name,
        "start_date": lease.start_date,
        "end_date": lease.end_date,
        "before_end_date": lease.before_end_date,
    }
    reminders = lease_rows.reminder_offsets(lease)
    if reminders:
        shown["reminders"] = [duration(o) for o in reminders]
    return shown


def record(
    session: Session,
    now: dt.datetime,
    actor: Actor,
    action: str,
    lease: Lease,
    detail: Mapping[str, object],
) -> None:
    audit.record(
        session,
        at=now,
        actor=actor,
        action=action,
        target_type="lease",
        target_id=lease.id,
        detail={"project_id": lease.project_id, **detail},
    )


def check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("name", "a lease needs a non-empty name")
    if len(name) > NAME_LENGTH:
        raise InvalidInput("name", f"at most {NAME_LENGTH} characters, not {len(name)}")
    inputs.name_text("name", name)
