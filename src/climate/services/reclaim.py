"""Reclaim: a waiting best-effort lease takes hosts by having other projects' movable instances
migrated away (docs/lease-types.md, "Reclaiming"). Run by the manager after its queue pass."""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import cast

from sqlalchemy.orm import Session

from climate.backends.base import Migrate, Migration, Timeboxed
from climate.context import ServiceContext
from climate.db import audit
from climate.db import instances as instance_rows
from climate.db import leases as lease_rows
from climate.db import reclaim as reclaim_rows
from climate.db.calendar_cache import CalendarCache
from climate.db.engine import ADMISSION_LOCK
from climate.db.tables import Host, Lease, Reservation
from climate.domain.status import LeaseStatus
from climate.errors import NotEnoughCapacity
from climate.notify import enqueue_lease
from climate.planner.instances import Size
from climate.planner.reclaim import (
    Blocker,
    Candidate,
    Move,
    ReclaimDemand,
    Target,
    TargetUse,
    plan_reclaim,
)
from climate.resources.capabilities import SharedHosts, WholeHosts
from climate.services import backend_records
from climate.services.leases import LeaseService

LOG = logging.getLogger(__name__)
ACTOR = "manager"
"""Who the audit log names for a reclaim: the manager does it, for the best-effort lease."""
MOVABLE_STATUSES = (LeaseStatus.ACTIVE, LeaseStatus.PENDING)


class MigrationFailed(Exception):
    """The backend could not migrate; the whole reclaim is rolled back."""


class ReclaimService:
    """Frees hosts for waiting best-effort leases whose ``physical:host`` reservation says
    ``reclaim: true``, when the backend can migrate (``Backend.can_migrate``).

    For each such lease still waiting after the queue pass (queue order), one admission-locked
    transaction: admit its reservations for its duration from now; where a reclaiming one is
    refused, plan which busy matching hosts to free (planner/reclaim.py: only hosts whose sole
    users in the window are movable instance reservations of other projects, and only if enough
    of them can be freed), move those instance allocations from now on (the past stays where it
    ran) and admit again. Then the backend migrates the instances (``Migrate``) and the
    lease is admitted like any queue admission. Any refusal or backend failure rolls all of it
    back; the lease keeps waiting with the reason. Each moved lease gets a ``lease.update``
    notification and a ``lease.reclaimed_from`` audit row naming the best-effort lease.
    """

    def __init__(self, ctx: ServiceContext, backend: Timeboxed) -> None:
        self.ctx = ctx
        self.backend = backend

    def serve_queue(self) -> int:
        """Try reclaiming for every waiting best-effort lease that asks to; returns how many
        were admitted."""
        if not self.backend.can_migrate:
            return 0
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            hunting = reclaim_rows.hunting(session, now)
        return sum(self._reclaim(lease_id, now) for lease_id in hunting)

    def _reclaim(self, lease_id: str, now: dt.datetime) -> int:
        try:
            with self.ctx.db.transaction(lock=ADMISSION_LOCK) as session:
                lease = lease_rows.get_for_update(session, lease_id)
                if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                    return 0
                shift = now - lease.start_date
                moves = self._admit(session, lease, now, lease.end_date + shift)
                migrations = [_migration(session, m, now) for m in moves]
                if migrations:
                    try:
                        self.backend.one(Migrate(tuple(migrations)))
                    except Exception as exc:
                        raise MigrationFailed(f"{type(exc).__name__}: {exc}") from exc
                    backend_records.migrated(session, migrations)
                LeaseService(self.ctx).admitted_from_queue(session, lease, now)
                self._record_moves(session, lease, moves, now)
            if moves:
                LOG.info(
                    "lease %s admitted by reclaim: %d allocation(s) moved", lease_id, len(moves)
                )
            return 1
        except NotEnoughCapacity as refused:
            self._refused(lease_id, str(refused), now)
        except MigrationFailed as failed:
            LOG.warning("lease %s: reclaim rolled back, migration failed: %s", lease_id, failed)
            self._refused(lease_id, f"migration failed: {failed}", now)
        return 0

    def _admit(
        self, session: Session, lease: Lease, now: dt.datetime, end: dt.datetime
    ) -> list[Move]:
        """Admit every reservation of ``lease`` over [now, end), freeing hosts for a
        reclaiming one that does not fit; returns the moves made."""
        moves: list[Move] = []
        for reservation in lease.reservations:
            resource_type = self.ctx.resource_types[reservation.resource_type]
            try:
                resource_type.admit(session, reservation, now, end, active=False, now=now)
            except NotEnoughCapacity:
                if reservation.resource_type != reclaim_rows.HOST_TYPE:
                    raise
                if reservation.params.get("reclaim") is not True:
                    raise
                moves += self._free(session, lease, reservation, now, end)
                resource_type.admit(session, reservation, now, end, active=False, now=now)
        return moves

    def _free(
        self,
        session: Session,
        lease: Lease,
        reservation: Reservation,
        start: dt.datetime,
        end: dt.datetime,
    ) -> list[Move]:
        """Plan (planner/reclaim.py) and write the moves that free enough matching hosts.

        :raises NotEnoughCapacity: not enough hosts can be freed, with why.
        """
        hosts = cast(WholeHosts, self.ctx.resource_types[reclaim_rows.HOST_TYPE])
        instances = self.ctx.resource_types.get(reclaim_rows.INSTANCE_TYPE)
        params = reservation.params
        matching = hosts.inventory.matching(
            session, params["hypervisor_properties"], params["resource_properties"]
        )
        ids = [int(h) for h in matching.ids.tolist()]
        whole = {h for h, _, _ in reclaim_rows.whole_spans(session, ids, start, end)}
        held = reclaim_rows.holdings(session, ids, start, end)
        busy = whole | {h.host_id for h in held}
        free = frozenset(ids) - busy
        need = params["min"] - len(free)
        if need <= 0 or not isinstance(instances, SharedHosts):
            return []  # refused for another reason: admitting again says which
        candidates, capacity = self._candidates(session, lease, instances, held, whole, busy)
        blockers = [b for c in candidates if not c.fixed for b in c.blockers]
        if not blockers:
            raise NotEnoughCapacity(
                f"reclaim: {need} more host(s) needed, but no busy matching host is held only "
                "by movable instances of other projects"
            )
        targets = self._targets(session, capacity, start, max(b.end for b in blockers))
        found = plan_reclaim(ReclaimDemand(start, end, need, start, free), candidates, targets)
        for move in found.moves:
            reclaim_rows.move_allocation(session, move.blocker.allocation_id, move.to_host, start)
        touched = {m.blocker.host_id for m in found.moves} | {m.to_host for m in found.moves}
        owners = [instance_rows.usage_owner(h) for h in sorted(touched)]
        CalendarCache.mark_stale(session, "hosts", owners)
        _expire_moved(session, {m.blocker.reservation_id for m in found.moves})
        return found.moves

    def _candidates(
        self,
        session: Session,
        lease: Lease,
        instances: SharedHosts,
        held: Sequence[reclaim_rows.Holding],
        whole: set[int],
        busy: set[int],
    ) -> tuple[list[Candidate], dict[int, Size]]:
        """The busy matching hosts with their movable instance allocations, and the size of
        every host those may move to."""
        pending = {h.lease_id for h in held if h.lease_status == LeaseStatus.PENDING}
        startable = reclaim_rows.hold_starts(session, pending)
        eligible: dict[str, frozenset[int]] = {}
        capacity: dict[int, Size] = {}
        per_host: dict[int, list[Blocker]] = defaultdict(list)
        fixed = set(whole)
        for h in held:
            if not _movable(h, lease.project_id, startable):
                fixed.add(h.host_id)
                continue
            query = h.params.get("resource_properties", "")
            if query not in eligible:
                rooms = instances.sized_hosts(session, query)
                capacity.update((r.id, r.capacity) for r in rooms)
                eligible[query] = frozenset(r.id for r in rooms)
            per_host[h.host_id].append(_blocker(h, eligible[query]))
        candidates = [
            Candidate(host, per_host.get(host, ()), host in fixed) for host in sorted(busy)
        ]
        return candidates, capacity

    def _targets(
        self, session: Session, capacity: dict[int, Size], start: dt.datetime, end: dt.datetime
    ) -> list[Target]:
        """The hosts instances may move to, with what they hold over [start, end)."""
        ids = sorted(capacity)
        whole: dict[int, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
        for host, s, e in reclaim_rows.whole_spans(session, ids, start, end):
            whole[host].append((s, e))
        uses: dict[int, list[TargetUse]] = defaultdict(list)
        for h in reclaim_rows.holdings(session, ids, start, end):
            used = Size(h.vcpus, h.memory_mb, h.disk_gb)
            uses[h.host_id].append(TargetUse(h.start, h.end, used, h.reservation_id))
        return [Target(i, capacity[i], whole.get(i, ()), uses.get(i, ())) for i in ids]

    def _record_moves(
        self, session: Session, lease: Lease, moves: Sequence[Move], now: dt.datetime
    ) -> None:
        """Audit and notify every moved lease, naming the best-effort lease; audit the reclaim
        on the best-effort lease too."""
        if not moves:
            return
        per_lease: dict[str, list[dict[str, object]]] = defaultdict(list)
        for m in moves:
            per_lease[m.blocker.lease_id].append(_described(m))
        for moved_id, described in sorted(per_lease.items()):
            moved = lease_rows.get(session, moved_id)
            if moved is None:
                continue
            moved.updated_at = now
            audit.record(
                session,
                at=now,
                actor=ACTOR,
                action="lease.reclaimed_from",
                target_type="lease",
                target_id=moved_id,
                detail={"project_id": moved.project_id, "by_lease": lease.id, "moves": described},
            )
            enqueue_lease(session, self.ctx.settings, "lease.update", moved, now)
        audit.record(
            session,
            at=now,
            actor=ACTOR,
            action="lease.reclaim",
            target_type="lease",
            target_id=lease.id,
            detail={
                "project_id": lease.project_id,
                "freed_hosts": sorted({m.blocker.host_id for m in moves}),
                "moved_leases": sorted(per_lease),
            },
        )

    def _refused(self, lease_id: str, reason: str, now: dt.datetime) -> None:
        """Keep the lease waiting, its last refusal followed by why reclaiming did not help."""
        with self.ctx.db.transaction() as session:
            lease = lease_rows.get_for_update(session, lease_id)
            if lease is None or lease.status != LeaseStatus.IN_PROGRESS:
                return
            refusal = (lease.status_reason or "").partition("; reclaim: ")[0]
            reason = reason.removeprefix("reclaim: ")
            lease.status_reason = f"{refusal}; reclaim: {reason}" if refusal else reason
            lease.updated_at = now


def _movable(h: reclaim_rows.Holding, project_id: str, startable: set[str]) -> bool:
    """Another project's instances, not marked unmovable, running or not yet being started."""
    if h.project_id == project_id or h.params.get("movable") is False:
        return False
    if h.lease_status == LeaseStatus.ACTIVE:
        return True
    return h.lease_status == LeaseStatus.PENDING and h.lease_id in startable


def _blocker(h: reclaim_rows.Holding, eligible: frozenset[int]) -> Blocker:
    each = Size(h.vcpus // h.count, h.memory_mb // h.count, h.disk_gb // h.count)
    return Blocker(
        allocation_id=h.id,
        reservation_id=h.reservation_id,
        lease_id=h.lease_id,
        project_id=h.project_id,
        host_id=h.host_id,
        count=h.count,
        size=each,
        start=h.start,
        end=h.end,
        affinity=h.params.get("affinity"),
        eligible=eligible,
    )


def _migration(session: Session, move: Move, now: dt.datetime) -> Migration:
    b = move.blocker
    hosts = [session.get(Host, host_id) for host_id in (b.host_id, move.to_host)]
    names = [h.service_name or h.hypervisor_hostname if h is not None else "" for h in hosts]
    return Migration(
        lease_id=b.lease_id,
        reservation_id=b.reservation_id,
        project_id=b.project_id,
        resource_type=reclaim_rows.INSTANCE_TYPE,
        from_host=b.host_id,
        to_host=move.to_host,
        count=b.count,
        at=now,
        from_name=names[0],
        to_name=names[1],
    )


def _described(move: Move) -> dict[str, object]:
    b = move.blocker
    return {
        "reservation_id": b.reservation_id,
        "from_host": b.host_id,
        "to_host": move.to_host,
        "count": b.count,
    }


def _expire_moved(session: Session, reservation_ids: set[str]) -> None:
    """Reservations of this session that moved show their new allocations on next access."""
    for obj in list(session.identity_map.values()):
        if isinstance(obj, Reservation) and obj.id in reservation_ids:
            session.expire(obj, ["instance_allocations"])
