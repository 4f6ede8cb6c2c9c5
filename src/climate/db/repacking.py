"""Re-optimising pending leases (planner/repack.py): what the search reads, and the moves."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Text, bindparam, cast, select
from sqlalchemy.orm import Session

from climate.db.chunks import chunked
from climate.db.tables import Event, HostAllocation, Lease, Reservation
from climate.domain.status import EventStatus, EventType, LeaseStatus, ReservationStatus
from climate.planner.repack import Holder, Move, Occupant


class DatabaseWorld:
    """The planner's view of the calendar during one admission (``planner.repack.World``).

    :param spans: the allocations of a host overlapping a window, from the in-memory calendar.
    :param counts: how many allocations each of some hosts has in a window, from it too.
    :param eligible: the reservable hosts matching a reservation's parameters.
    :param reservation_id: the reservation being admitted: its own allocations are being
        replaced, so they are not there.
    :param lease_id: its lease: the other reservations of that lease stay where they are.
    :param fixed: leases whose start this admission could not hold (``hold_starts``): they
        stay where they are.
    """

    def __init__(
        self,
        session: Session,
        spans: Callable[[int, dt.datetime, dt.datetime], Sequence[Occupant]],
        counts: Callable[[Collection[int], dt.datetime, dt.datetime], Mapping[int, int]],
        eligible: Callable[[dict[str, Any]], frozenset[int]],
        reservation_id: str,
        lease_id: str,
        fixed: Collection[str] = (),
    ) -> None:
        self.session = session
        self.spans = spans
        self.counts = counts
        self.eligible = eligible
        self.reservation_id = reservation_id
        self.lease_id = lease_id
        self.fixed = fixed

    def occupants(self, host: int, start: dt.datetime, end: dt.datetime) -> list[Occupant]:
        return [o for o in self.spans(host, start, end) if o[2] != self.reservation_id]

    def holders(self, ids: Collection[str]) -> dict[str, Holder]:
        """Each reservation's allocations, status and parameters: one query per chunk of ids.

        On the connection, with a statement built once: the ORM's execution and row loading,
        and decoding the parameters again on every allocation row, were most of a refusal's
        quick search (``planner.repack``). Only a pending holder's parameters are decoded."""
        self.session.flush()  # as the ORM's execution would: the rows as this transaction has them
        connection = self.session.connection()
        rows: dict[str, list[Any]] = {}
        for chunk in chunked(sorted(ids)):
            for row in connection.execute(_HOLDERS, {"ids": chunk}):
                rows.setdefault(row[0], []).append(row)
        found = {}
        for rid, group in rows.items():
            _, _, lid, start, end, lease_status, deleted_at, status, params = group[0]
            pending = (
                lease_status == LeaseStatus.PENDING
                and status == ReservationStatus.PENDING
                and deleted_at is None
                and lid != self.lease_id
                and lid not in self.fixed
            )
            found[rid] = Holder(
                id=rid,
                lease_id=lid,
                start=start,
                end=end,
                hosts=frozenset(r[1] for r in group),
                eligible=self.eligible(json.loads(params)) if pending else frozenset(),
                pending=pending,
                uniform=all((r[3], r[4]) == (start, end) for r in group),
            )
        return found


_HOLDERS = (
    select(
        HostAllocation.reservation_id,
        HostAllocation.host_id,
        HostAllocation.lease_id,
        HostAllocation.start_date,
        HostAllocation.end_date,
        Lease.status,
        Lease.deleted_at,
        Reservation.status,
        cast(Reservation.params, Text),  # decoded only where needed, once a reservation
    )
    .join(Reservation, Reservation.id == HostAllocation.reservation_id)
    .join(Lease, Lease.id == HostAllocation.lease_id)
    .where(HostAllocation.reservation_id.in_(bindparam("ids", expanding=True)))
)


def hold_starts(session: Session, lease_ids: Collection[str]) -> set[str]:
    """Those of ``lease_ids`` whose start event waits, locked until this admission ends.

    A lease shows PENDING while a manager starts it, from hosts it read before; moving it then
    would leave it running where it is no longer allocated. So a lease is moved only while this
    transaction holds its waiting start: no manager can take it meanwhile (they skip locked
    events), and one that holds it now is skipped here, not waited for. Only the leases a plan
    moves are held, once it is found: the search reads many more.
    """
    wanted = sorted(lease_ids)
    held: set[str] = set()
    for chunk in chunked(wanted):
        query = (
            select(Event.lease_id)
            .where(
                Event.lease_id.in_(chunk),
                Event.event_type == EventType.START_LEASE,
                Event.status == EventStatus.UNDONE,
            )
            .with_for_update(skip_locked=True)
        )
        held.update(session.scalars(query))
    return held


Replace = Callable[[str, str, list[int], dt.datetime, dt.datetime], None]
"""``replace(reservation_id, lease_id, hosts, start, end)``: the reservation holds exactly
``hosts`` over [start, end) (``CalendarCache.replace``, which keeps the in-memory calendar and its
change log in step)."""


def apply(session: Session, moves: Sequence[Move], replace: Replace) -> None:
    """Give each moved reservation its new hosts, same window.

    First every moved reservation gives up the hosts it leaves, then each takes its new ones: so
    that no host is ever held twice at once, even where moves chain or swap (PostgreSQL's
    exclusion constraint checks every row as it is written).
    """
    for m in moves:
        replace(m.reservation_id, m.lease_id, sorted(m.kept), m.start, m.end)
    for m in moves:
        replace(m.reservation_id, m.lease_id, sorted(m.kept | m.added), m.start, m.end)
    # Reservations of this session that moved show their new hosts on next access.
    moved = {m.reservation_id for m in moves}
    for obj in list(session.identity_map.values()):
        if isinstance(obj, Reservation) and obj.id in moved:
            session.expire(obj, ["allocations"])
