"""Ending a reservation's allocations at an instant (``allocations.truncate``, a deletion's and
an early end's cut): rows that had not begun go, rows under way end there, and the session's
objects of those rows say the same as the database, with nothing left to flush."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from climate.db import allocations
from climate.db.engine import Database
from climate.db.tables import HostAllocation, Reservation
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, T0
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)


def _stored(db: Database, reservation_id: str) -> list[tuple[int, dt.datetime, dt.datetime]]:
    with db.reader() as session:
        rows = session.execute(
            select(HostAllocation.host_id, HostAllocation.start_date, HostAllocation.end_date)
            .where(HostAllocation.reservation_id == reservation_id)
            .order_by(HostAllocation.host_id)
        )
        return [(h, s, e) for h, s, e in rows]


def test_a_cut_inside_the_window_ends_rows_and_objects_at_it(
    db: Database, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 3)
    lease = leases.create(ADMIN, host_request("cut", T0 + HOUR, T0 + 5 * HOUR, min_hosts=2))
    rid = lease.reservations[0].id
    at = T0 + 2 * HOUR
    with db.transaction() as session:
        reservation = session.get(Reservation, rid)
        assert reservation is not None
        loaded = list(reservation.allocations)
        allocations.truncate(session, HostAllocation, rid, at)
        assert [a.end_date for a in loaded] == [at, at]
        assert all(a in session for a in loaded)
        assert not session.dirty  # the database already says so: nothing to write back
    assert [(s, e) for _, s, e in _stored(db, rid)] == [(T0 + HOUR, at)] * 2


def test_a_cut_before_the_window_drops_rows_and_objects(
    db: Database, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    lease = leases.create(ADMIN, host_request("gone", T0 + 3 * HOUR, T0 + 5 * HOUR))
    other = leases.create(ADMIN, host_request("kept", T0 + 3 * HOUR, T0 + 5 * HOUR))
    rid, kept = lease.reservations[0].id, other.reservations[0].id
    with db.transaction() as session:
        reservation = session.get(Reservation, rid)
        neighbour = session.get(Reservation, kept)
        assert reservation is not None and neighbour is not None
        loaded, untouched = list(reservation.allocations), list(neighbour.allocations)
        allocations.truncate(session, HostAllocation, rid, T0 + HOUR)
        assert loaded and not any(a in session for a in loaded)
        assert all(a in session and a.end_date == T0 + 5 * HOUR for a in untouched)
    assert _stored(db, rid) == []
    assert [(s, e) for _, s, e in _stored(db, kept)] == [(T0 + 3 * HOUR, T0 + 5 * HOUR)]


def test_rows_that_ended_before_the_cut_stay_as_they_were(
    db: Database, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ADMIN, host_request("past", T0 + HOUR, T0 + 2 * HOUR))
    rid = lease.reservations[0].id
    with db.transaction() as session:
        allocations.truncate(session, HostAllocation, rid, T0 + 4 * HOUR)
    assert [(s, e) for _, s, e in _stored(db, rid)] == [(T0 + HOUR, T0 + 2 * HOUR)]
