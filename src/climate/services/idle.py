"""Idle reclamation (docs/idle.md): a running lease nobody uses is warned after
``idle_warning_hours`` and ended after ``idle_release_hours``, both counted from the later of its
start and the last sign of use. Signs of use: the backend's answer to ``InspectUsage``
(openstack: ACTIVE servers on the reserved hosts or of the reservation's flavor) and the
consumer's heartbeats (``POST /v1/leases/{id}/heartbeat``, the only sign the standalone backend
has). A warning goes out once per idle stretch, a sign of use starts a new stretch, and the end
comes at least ``idle_release_hours - idle_warning_hours`` after the warning. Leases of
``idle_exempt_projects``, and those an admin exempted, are never warned nor ended. Each warning
and end is audited and notified (``lease.idle.warning``, ``lease.idle.release``)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from sqlalchemy.orm import Session

from climate.backends.base import Handover, InspectUsage, Timeboxed, Usage
from climate.context import ServiceContext
from climate.db import audit
from climate.db import idle as idle_rows
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.records import LeaseIdle
from climate.db.tables import Lease
from climate.domain.actor import Actor
from climate.domain.status import LeaseStatus
from climate.errors import Conflict, NotFound
from climate.notify import enqueue_lease
from climate.services.operations import OperatorService

LOG = logging.getLogger(__name__)
ACTOR = "manager"
"""Who the audit log names for warnings and releases."""
WARNING = "lease.idle.warning"
RELEASE = "lease.idle.release"


class Step(Enum):
    NONE = "none"
    WARN = "warn"
    RELEASE = "release"


@dataclass(frozen=True)
class Stretch:
    """Where a lease stands: idle since ``since``, warned at ``warned_at`` in this stretch
    (None: not yet)."""

    since: dt.datetime
    warned_at: dt.datetime | None


def stretch(lease: Lease, record: LeaseIdle | None) -> Stretch:
    since = lease.start_date
    if record is not None and record.last_used_at is not None:
        since = max(since, record.last_used_at)
    warned = record.warned_at if record is not None else None
    return Stretch(since, warned if warned is not None and warned >= since else None)


def step(
    idle: Stretch, now: dt.datetime, warn_after: dt.timedelta, release_after: dt.timedelta
) -> Step:
    """What is due for a lease idle as ``idle`` says, at ``now``: nothing, the warning (after
    ``warn_after`` idle), or the end (after ``release_after`` idle, and at least the difference
    after the warning, which always comes first)."""
    if idle.warned_at is None:
        return Step.WARN if now - idle.since >= warn_after else Step.NONE
    if now - idle.since >= release_after and now - idle.warned_at >= release_after - warn_after:
        return Step.RELEASE
    return Step.NONE


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat recorded: the lease is in use at ``at``; if nothing else comes, it is warned
    at ``warning_at`` and ended at ``release_at`` (None: idle reclamation does not watch it)."""

    lease_id: str
    at: dt.datetime
    warning_at: dt.datetime | None
    release_at: dt.datetime | None


@dataclass(frozen=True)
class IdleState:
    """A lease as idle reclamation has it: exempted by an admin, last seen in use, last
    warned."""

    lease_id: str
    exempt: bool
    last_used_at: dt.datetime | None
    warned_at: dt.datetime | None


@dataclass(frozen=True)
class IdlePass:
    """What one pass of the manager did: the leases seen in use, warned and released."""

    in_use: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()
    released: tuple[str, ...] = ()


class IdleService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed | None = None) -> None:
        self.ctx = ctx
        self.backend = backend

    @property
    def _warn_after(self) -> dt.timedelta:
        return dt.timedelta(hours=self.ctx.settings.idle_warning_hours)

    @property
    def _release_after(self) -> dt.timedelta:
        return dt.timedelta(hours=self.ctx.settings.idle_release_hours)

    def _watches(self, lease: Lease, record: LeaseIdle | None) -> bool:
        settings = self.ctx.settings
        return (
            settings.idle_reclaim
            and lease.project_id not in settings.idle_exempt_projects
            and not (record is not None and record.exempt)
            and any(r.resource_type in settings.idle_resource_types for r in lease.reservations)
        )

    def _lease(self, session: Session, actor: Actor, lease_id: str, rule: str) -> Lease:
        """The live lease if the caller may see it (else NotFound, as every lease route) and
        ``rule`` allows the action on it (else Forbidden)."""
        lease = lease_rows.get(session, lease_id, project_id=self.ctx.policy.scope(actor))
        if lease is None:
            raise NotFound("Lease", lease_id, "lease_id")
        self.ctx.policy.enforce(
            actor, rule, {"project_id": lease.project_id, "user_id": lease.user_id}
        )
        return lease

    # -- an admin's opt-out ------------------------------------------------------------------

    def exempt(self, actor: Actor, lease_id: str, exempted: bool) -> IdleState:
        """Exempt the lease from idle reclamation (or no longer); audited ``lease.idle.exempt``.

        :raises NotFound: no such lease visible to the caller.
        :raises Forbidden: not an admin (``climate:leases:idle_exempt``).
        """
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            lease = self._lease(session, actor, lease_id, "climate:leases:idle_exempt")
            idle_rows.exempt(session, lease.id, exempted)
            audit.record(
                session,
                at=now,
                actor=actor,
                action="lease.idle.exempt",
                target_type="lease",
                target_id=lease.id,
                detail={"project_id": lease.project_id, "exempt": exempted},
            )
            record = idle_rows.record_of(session, lease.id)
            assert record is not None
            return IdleState(lease.id, record.exempt, record.last_used_at, record.warned_at)

    # -- the consumer's sign of use ----------------------------------------------------------

    def heartbeat(self, actor: Actor, lease_id: str) -> Heartbeat:
        """Record that the lease is in use now.

        :raises NotFound: no such lease visible to the caller.
        :raises Forbidden: the caller may not act on it (``climate:leases:heartbeat``).
        :raises Conflict: the lease is not running (ACTIVE).
        """
        now = self.ctx.clock.now()
        with self.ctx.db.transaction() as session:
            lease = self._lease(session, actor, lease_id, "climate:leases:heartbeat")
            if lease.status != LeaseStatus.ACTIVE:
                raise Conflict(f"lease {lease.id} is {lease.status}: only a running lease is used")
            idle_rows.used(session, lease.id, now)
            watched = self._watches(lease, idle_rows.record_of(session, lease.id))
        return Heartbeat(
            lease.id,
            now,
            now + self._warn_after if watched else None,
            now + self._release_after if watched else None,
        )

    # -- the manager's pass ------------------------------------------------------------------

    def run(self) -> IdlePass:
        """Ask the backend which watched leases are in use, record those that are, warn those
        idle for ``idle_warning_hours`` and end those idle for ``idle_release_hours``. A probe
        that fails decides nothing: no lease is warned or ended on a look that did not happen."""
        settings = self.ctx.settings
        if not settings.idle_reclaim:
            return IdlePass()
        assert self.backend is not None, "the manager's pass needs the backend"
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            watched = idle_rows.watched(
                session, settings.idle_resource_types, settings.idle_exempt_projects
            )
            handovers = tuple(
                self.ctx.handover(lease, reservation, now)
                for lease, _ in watched
                for reservation in lease.reservations
                if reservation.resource_type in settings.idle_resource_types
            )
            stretches = {lease.id: stretch(lease, record) for lease, record in watched}
        if not handovers:
            return IdlePass()
        usage = self._probe(handovers)
        if usage is None:
            return IdlePass()
        in_use = _leases_in_use(handovers, usage)
        if in_use:
            with self.ctx.db.transaction() as session:
                for lease_id in in_use:
                    idle_rows.used(session, lease_id, now)
        warned: list[str] = []
        released: list[str] = []
        for lease_id, idle in stretches.items():
            if lease_id in in_use:
                continue
            due = step(idle, now, self._warn_after, self._release_after)
            if due is Step.WARN and self._warn(lease_id, now):
                warned.append(lease_id)
            elif due is Step.RELEASE and self._release(lease_id, now):
                released.append(lease_id)
        return IdlePass(tuple(sorted(in_use)), tuple(warned), tuple(released))

    def _probe(self, handovers: tuple[Handover, ...]) -> Usage | None:
        assert self.backend is not None
        try:
            (result,) = self.backend.handle([InspectUsage(handovers)])
        except Exception as exc:  # the whole call failed: look again next pass
            result = exc
        if isinstance(result, Usage):
            return result
        LOG.warning("idle reclamation: the backend's usage probe failed: %s", result)
        return None

    def _warn(self, lease_id: str, now: dt.datetime) -> bool:
        with self.ctx.db.transaction() as session:
            lease = lease_rows.get(session, lease_id)
            record = idle_rows.record_of(session, lease_id)
            if lease is None or lease.status != LeaseStatus.ACTIVE:
                return False
            if not self._watches(lease, record):
                return False
            idle = stretch(lease, record)
            if step(idle, now, self._warn_after, self._release_after) is not Step.WARN:
                return False
            idle_rows.warned(session, lease_id, now)
            release_at = max(idle.since + self._release_after, now + self._gap)
            self._audit(session, WARNING, lease, idle.since, now, release_at=release_at)
            enqueue_lease(session, self.ctx.settings, WARNING, lease, now)
        LOG.info("lease %s idle since %s: warned, ends at %s", lease_id, idle.since, release_at)
        return True

    @property
    def _gap(self) -> dt.timedelta:
        return self._release_after - self._warn_after

    def _release(self, lease_id: str, now: dt.datetime) -> bool:
        operator = OperatorService(self.ctx)
        try:
            with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
                lease = operator.lock(session, lease_id, now)
                record = idle_rows.record_of(session, lease_id)
                if lease.status != LeaseStatus.ACTIVE or not self._watches(lease, record):
                    return False
                idle = stretch(lease, record)
                if step(idle, now, self._warn_after, self._release_after) is not Step.RELEASE:
                    return False
                hours = (now - idle.since) / dt.timedelta(hours=1)
                operator.end_now(session, lease, f"released: idle for {hours:.1f} h", now)
                self._audit(session, RELEASE, lease, idle.since, now)
                operator.done(session, lease, now, RELEASE)
        except (Conflict, NotFound) as exc:  # a manager runs one of its events: next pass
            LOG.info("idle reclamation: lease %s not released now: %s", lease_id, exc)
            return False
        LOG.info("lease %s idle since %s: released", lease_id, idle.since)
        return True

    def _audit(
        self,
        session: Session,
        action: str,
        lease: Lease,
        since: dt.datetime,
        now: dt.datetime,
        release_at: dt.datetime | None = None,
    ) -> None:
        detail: dict[str, object] = {
            "project_id": lease.project_id,
            "idle_since": since.isoformat(),
            "idle_hours": round((now - since) / dt.timedelta(hours=1), 3),
        }
        if release_at is not None:
            detail["release_at"] = release_at.isoformat()
        audit.record(
            session,
            at=now,
            actor=ACTOR,
            action=action,
            target_type="lease",
            target_id=lease.id,
            detail=detail,
        )


def _leases_in_use(handovers: Sequence[Handover], usage: Usage) -> set[str]:
    """The leases one of whose reservations the backend saw in use."""
    return {h.lease_id for h in handovers if usage.in_use.get(h.reservation_id)}
