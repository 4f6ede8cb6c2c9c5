"""Host health and healing: a host down (in the cloud: down, forced down or disabled) is no
longer reservable, and the reservations on it that run now or start within the horizon get a
free matching host in its place, or go on without it with the lease marked degraded; a host back
up is reservable again and fills what degraded leases lack (docs/healing.md).

Blazar's ``heal_reservations`` and ``_reallocate`` (plugins/oshosts/host_plugin.py), run the
moment the state changes instead of on the next poll: the admin API and ``climate host down|up``
here; the openstack backend's monitor (os-services, ``service.update``) calls the same service.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy.orm import Session

from climate import inputs
from climate.backends.base import Replace, Timeboxed
from climate.context import ServiceContext
from climate.db import audit
from climate.db import hosts as host_rows
from climate.db import instances as instance_rows
from climate.db import leases as lease_rows
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Host, Lease, Reservation
from climate.domain.actor import Actor
from climate.domain.status import LeaseStatus
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity
from climate.notify import enqueue_lease
from climate.planner.hosts import replacements
from climate.planner.instances import InstanceDemand, Size, place
from climate.resources.capabilities import SharedHosts, WholeHosts
from climate.services import backend_records
from climate.services.hosts import load_host, wake_queue

LOG = logging.getLogger(__name__)
HOST_TYPE = "physical:host"
ACTOR = "manager"
"""Who the audit log names for healing the manager does on its own (reservations coming into
the horizon, degraded leases filled once a host is steady)."""
MAX_REASON = 255


@dataclass(frozen=True)
class Healed:
    """One step of healing: ``old_host`` (None: a host a degraded reservation lacked) replaced
    by ``new_host`` (None: no free matching host, the reservation goes on without it)."""

    lease_id: str
    reservation_id: str
    old_host: int | None
    new_host: int | None
    handed_over: bool
    """The reservation was running: the backend was told (``Replace``)."""
    error: str | None = None
    """Why the backend could not hand ``new_host`` over (then it was not taken)."""

    def described(self) -> dict[str, object]:
        found: dict[str, object] = {
            "reservation_id": self.reservation_id,
            "from_host": self.old_host,
            "to_host": self.new_host,
        }
        if self.error is not None:
            found["error"] = self.error
        return found


@dataclass(frozen=True)
class HealReport:
    host: Host
    healed: list[Healed]


class HealingService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed) -> None:
        self.ctx = ctx
        self.backend = backend

    @property
    def _hosts(self) -> WholeHosts:
        return cast(WholeHosts, self.ctx.resource_types[HOST_TYPE])

    @property
    def _instances(self) -> SharedHosts:
        return cast(SharedHosts, self.ctx.resource_types[instance_rows.RESOURCE_TYPE])

    def mark_down(self, actor: Actor | str, host_id: str, reason: object = None) -> HealReport:
        """The host is down: unreservable from now, its reservations healed at once. Marking a
        host already down again changes only the reason."""
        if isinstance(actor, Actor):
            self.ctx.policy.enforce(actor, "blazar:oshosts:put")
        text = _reason(reason)
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            host = load_host(session, host_id)
            if host.health != host_rows.DOWN:
                host.health = host_rows.DOWN
                host.health_since = host.last_down_at = now
                host_rows.bump_inventory(session)
                _audit_host(session, now, actor, "down", host, reason=text)
            host.health_reason = text
            host.updated_at = now
            healed = self._heal(session, now, actor)
            session.flush()
            session.refresh(host)
            return HealReport(host, healed)

    def mark_up(self, actor: Actor | str, host_id: str) -> HealReport:
        """The host is back: reservable again. Degraded leases take it (or any other free
        matching host) only once it has stayed up ``heal_interval_seconds`` since it last went
        down; before that it takes new leases only."""
        if isinstance(actor, Actor):
            self.ctx.policy.enforce(actor, "blazar:oshosts:put")
        now = self.ctx.clock.now()
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            host = load_host(session, host_id)
            if host.health != host_rows.UP:
                host.health = host_rows.UP
                host.health_since = now
                host.health_reason = None
                host.updated_at = now
                host_rows.bump_inventory(session)
                _audit_host(session, now, actor, "up", host)
                wake_queue(self.ctx, session, now)
            healed = self._heal(session, now, actor)
            session.flush()
            session.refresh(host)
            return HealReport(host, healed)

    def heal_due(self) -> bool:
        """The manager's pass: heal what came into the horizon on a down host and fill degraded
        leases from steady hosts. Returns whether anything may still need it later."""
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            down = host_rows.down_host_ids(session)
            missing = host_rows.missing_hosts(session, now) or instance_rows.lacking(session, now)
        if not down and not missing:
            return False
        with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
            self._heal(session, now, ACTOR)
        return True

    # -- the use case ------------------------------------------------------------------------

    def _heal(self, session: Session, now: dt.datetime, actor: Actor | str) -> list[Healed]:
        settings = self.ctx.settings
        horizon = settings.heal_horizon_seconds
        until = now + dt.timedelta(seconds=horizon) if horizon else None
        recent = now - dt.timedelta(seconds=settings.heal_interval_seconds)
        unusable = host_rows.unsteady_host_ids(session, recent)
        steps: list[Healed] = []
        down = host_rows.down_host_ids(session)
        for found in host_rows.suffering(session, down, now, until):
            steps.append(self._replace(session, found, unusable, now))
        touched = {s.reservation_id for s in steps}  # a failed hand-over is tried next pass
        for reservation in host_rows.missing_hosts(session, now):
            if reservation.id not in touched:
                steps += self._refill(session, reservation, unusable, now)
        for lost in instance_rows.suffering(session, down, now, until):
            steps += self._replace_instances(session, lost, set(down), unusable, now)
        touched = {s.reservation_id for s in steps}
        for reservation in instance_rows.lacking(session, now):
            if reservation.id not in touched:
                steps += self._place_instances(session, reservation, set(down), unusable, now)
        self._record(session, steps, actor, now)
        return steps

    def _replace(
        self, session: Session, found: host_rows.Suffering, unusable: set[int], now: dt.datetime
    ) -> Healed:
        reservation = lease_rows.reservation(session, found.reservation_id)
        lease = reservation.lease
        picked = self._pick(session, reservation, max(now, found.start), found.end, 1, unusable)
        new = picked[0] if picked else None
        running = lease.status == LeaseStatus.ACTIVE and found.start <= now
        error = None
        if running:
            error = self._hand_over(session, lease, reservation, found.host_id, new, now)
            if error is not None:
                new = None
        host_rows.move_allocation(session, found, new, now)
        self._reread(session, reservation)
        if new is None:
            name = host_rows.display_name(session, found.host_id)
            reservation.missing_hosts = [*(reservation.missing_hosts or []), name]
            reservation.missing_resources = True
            lease.degraded = True
        elif running:
            reservation.resources_changed = True
        level = logging.WARNING if new is None else logging.INFO
        LOG.log(
            level,
            "lease %s: reservation %s lost host %s, %s",
            lease.id,
            reservation.id,
            found.host_id,
            f"replaced by host {new}" if new is not None else "no free matching host",
        )
        return Healed(lease.id, reservation.id, found.host_id, new, running, error)

    def _refill(
        self, session: Session, reservation: Reservation, unusable: set[int], now: dt.datetime
    ) -> list[Healed]:
        """Give a degraded reservation free steady hosts for what it lacks, from now on."""
        lease = reservation.lease
        missing = list(reservation.missing_hosts or [])
        start, end = max(now, lease.start_date), lease.end_date
        # The hosts it still holds are busy in the calendar over [start, end): never picked.
        picked = self._pick(session, reservation, start, end, len(missing), unusable)
        running = lease.status == LeaseStatus.ACTIVE and lease.start_date <= now
        steps: list[Healed] = []
        for new in picked:
            if running:
                error = self._hand_over(session, lease, reservation, None, new, now)
                if error is not None:
                    steps.append(Healed(lease.id, reservation.id, None, None, True, error))
                    break
            host_rows.add_allocation(session, reservation.id, lease.id, new, start, end)
            missing.pop(0)
            steps.append(Healed(lease.id, reservation.id, None, new, running))
        if not picked:
            return steps
        self._reread(session, reservation)
        reservation.missing_hosts = missing or None
        reservation.missing_resources = bool(missing)
        if running:
            reservation.resources_changed = True
        lease.degraded = any(r.missing_resources for r in lease.reservations)
        return steps

    # -- instance reservations (Blazar's instance_plugin.heal_reservations) -------------------

    def _replace_instances(
        self,
        session: Session,
        lost: instance_rows.Suffering,
        down: set[int],
        unusable: set[int],
        now: dt.datetime,
    ) -> list[Healed]:
        """The instances ``lost`` held on a failed host, placed on free matching hosts from now
        on (as the reservation's affinity allows), or the reservation goes on without them."""
        reservation = lease_rows.reservation(session, lost.reservation_id)
        instance_rows.cut(session, lost.allocation_id, max(now, lost.start))
        self._instances.changed(session, {lost.host_id})
        session.expire(reservation, ["instance_allocations"])
        name = host_rows.display_name(session, lost.host_id)
        if name not in (reservation.missing_hosts or []):
            reservation.missing_hosts = [*(reservation.missing_hosts or []), name]
        return self._place_instances(session, reservation, down, unusable, now, lost.host_id)

    def _place_instances(
        self,
        session: Session,
        reservation: Reservation,
        down: set[int],
        unusable: set[int],
        now: dt.datetime,
        old: int | None = None,
    ) -> list[Healed]:
        """Give an instance reservation what it lacks from now to its end on free steady hosts
        (as many as fit when not all do); a running one through ``Replace``, ``old`` (the
        failed host, if any) first out."""
        lease = reservation.lease
        params = reservation.params
        start, end = max(now, lease.start_date), lease.end_date
        size = Size(params["vcpus"], params["memory_mb"], params["disk_gb"])
        keep: Counter[int] = Counter()
        for row in reservation.instance_allocations:
            if row.end_date > start and row.host_id not in down:
                keep[row.host_id] += row.count
        rooms = [
            r
            for r in self._instances.rooms(session, reservation, start, end)
            if r.id not in unusable or r.id in keep
        ]
        placement: dict[int, int] = dict(keep)
        for amount in range(params["amount"], sum(keep.values()), -1):
            demand = InstanceDemand(start, end, amount, size, params["affinity"], dict(keep))
            try:
                placement = place(demand, rooms)
                break
            except (NotEnoughCapacity, Conflict):
                continue
        added = {h: c - keep[h] for h, c in sorted(placement.items()) if c > keep[h]}
        running = lease.status == LeaseStatus.ACTIVE and lease.start_date <= now
        steps: list[Healed] = []
        given: dict[int, int] = {}
        for host_id, count in added.items():
            error = None
            if running:
                after = keep + Counter(given) + Counter({host_id: count})
                error = self._hand_over_instances(session, lease, reservation, after, old, host_id)
            steps.append(
                Healed(lease.id, reservation.id, old, None if error else host_id, running, error)
            )
            if error is not None:
                break
            given[host_id] = count
            old = None
        if old is not None:  # nothing free: the failed host still leaves the reservation
            error = None
            if running:
                error = self._hand_over_instances(
                    session, lease, reservation, keep + Counter(given), old, None
                )
            steps.append(Healed(lease.id, reservation.id, old, None, running, error))
        instance_rows.add(session, reservation.id, lease.id, given, size.as_tuple(), start, end)
        self._instances.changed(session, set(given))
        session.flush()
        session.expire(reservation, ["instance_allocations"])
        short = params["amount"] - sum(keep.values()) - sum(given.values())
        reservation.missing_resources = short > 0
        if short <= 0:
            reservation.missing_hosts = None
        if running and given:
            reservation.resources_changed = True
        lease.degraded = any(r.missing_resources for r in lease.reservations)
        LOG.log(
            logging.WARNING if short > 0 else logging.INFO,
            "lease %s: instance reservation %s placed %s, %d instance(s) still lacking",
            lease.id,
            reservation.id,
            given or "nothing",
            max(short, 0),
        )
        return steps

    def _hand_over_instances(
        self,
        session: Session,
        lease: Lease,
        reservation: Reservation,
        after: Counter[int],
        old: int | None,
        new: int | None,
    ) -> str | None:
        """``Replace`` for an instance reservation whose slots are ``after`` (per host) once
        ``old`` is out and ``new`` in; the error if the backend failed."""
        handover = self.ctx.handover(lease, reservation, self.ctx.clock.now())
        slots = tuple(f"{h}:{n}" for h, c in sorted(after.items()) for n in range(c))
        names = {
            str(h): host_rows.service_name(session, h) for h in {*after, old, new} if h is not None
        }
        action = Replace(
            dataclasses.replace(handover, resource_ids=slots, hosts=names),
            None if old is None else str(old),
            None if new is None else str(new),
        )
        try:
            self.backend.one(action)
        except Exception as exc:
            LOG.warning(
                "lease %s: backend %s failed to replace host %s by %s for instances: %s",
                lease.id,
                self.backend.name,
                old,
                new,
                exc,
            )
            return f"{type(exc).__name__}: {exc}"
        backend_records.replaced(session, action)
        return None

    def _pick(
        self,
        session: Session,
        reservation: Reservation,
        start: dt.datetime,
        end: dt.datetime,
        count: int,
        unusable: set[int],
    ) -> list[int]:
        if count <= 0 or end <= start:
            return []
        view = self._hosts.view(session, reservation.params, start, end)
        return replacements(view, count, unusable)

    def _hand_over(
        self,
        session: Session,
        lease: Lease,
        reservation: Reservation,
        old: int | None,
        new: int | None,
        now: dt.datetime,
    ) -> str | None:
        """Tell the backend (``Replace``) and record what it did; the error if it failed."""
        handover = self.ctx.handover(lease, reservation, now)
        after = [h for h in handover.resource_ids if h != str(old)]
        if new is not None:
            after.append(str(new))
        names = dict(handover.hosts)
        for host_id in (old, new):
            if host_id is not None:
                names[str(host_id)] = host_rows.service_name(session, host_id)
        action = Replace(
            dataclasses.replace(handover, resource_ids=tuple(after), hosts=names),
            None if old is None else str(old),
            None if new is None else str(new),
        )
        try:
            self.backend.one(action)
        except Exception as exc:
            LOG.warning(
                "lease %s: backend %s failed to replace host %s by %s: %s",
                lease.id,
                self.backend.name,
                old,
                new,
                exc,
            )
            return f"{type(exc).__name__}: {exc}"
        backend_records.replaced(session, action)
        return None

    def _reread(self, session: Session, reservation: Reservation) -> None:
        self._hosts.calendar.reread(session, [reservation.id])
        session.flush()
        session.expire(reservation, ["allocations"])

    def _record(
        self, session: Session, steps: Sequence[Healed], actor: Actor | str, now: dt.datetime
    ) -> None:
        """One audit row and one notification per lease: ``lease.degraded`` when it lacks a
        host after this, else ``lease.healed``."""
        per_lease: dict[str, list[Healed]] = defaultdict(list)
        for step in steps:
            per_lease[step.lease_id].append(step)
        for lease_id, done in sorted(per_lease.items()):
            lease = session.get(Lease, lease_id)
            if lease is None:
                continue
            lease.updated_at = now
            topic = "lease.degraded" if lease.degraded else "lease.healed"
            missing = sorted(name for r in lease.reservations for name in (r.missing_hosts or []))
            audit.record(
                session,
                at=now,
                actor=actor,
                action=topic,
                target_type="lease",
                target_id=lease_id,
                detail={
                    "project_id": lease.project_id,
                    "steps": [s.described() for s in done],
                    "missing_hosts": missing,
                },
            )
            enqueue_lease(session, self.ctx.settings, topic, lease, now)


def _audit_host(
    session: Session,
    now: dt.datetime,
    actor: Actor | str,
    action: str,
    host: Host,
    **detail: object,
) -> None:
    audit.record(
        session,
        at=now,
        actor=actor,
        action=f"host.{action}",
        target_type="host",
        target_id=str(host.id),
        detail={"name": host.hypervisor_hostname, **detail},
    )


def _reason(value: object) -> str | None:
    """:raises InvalidInput: not text, too long or with control characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("reason", "must be a string")
    if len(value) > MAX_REASON:
        raise InvalidInput("reason", f"at most {MAX_REASON} characters")
    inputs.name_text("reason", value)
    return value
