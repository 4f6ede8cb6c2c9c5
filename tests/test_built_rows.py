"""Rows made by ``tables.built`` (without the ORM's attribute events) are the rows the
constructor makes: the same attributes, both sides of each relationship, and added to a session
they are inserted whole."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import inspect, select

from climate.db.engine import Database
from climate.db.tables import Lease, Reservation, built, new_id
from climate.domain.status import EventStatus, EventType, LeaseStatus, ReservationStatus
from climate.services.leases.base import event
from tests.conftest import T0

HOUR = dt.timedelta(hours=1)


def lease_columns(lease_id: str) -> dict[str, object]:
    return {
        "id": lease_id,
        "name": "built",
        "project_id": "p",
        "user_id": "u",
        "start_date": T0 + HOUR,
        "end_date": T0 + 2 * HOUR,
        "status": LeaseStatus.PENDING,
        "lease_type": "scheduled",
        "priority": 0,
        "attempts": 0,
        "degraded": False,
        "created_at": T0,
    }


def reservation_columns(lease_id: str) -> dict[str, object]:
    return {
        "id": new_id(),
        "lease_id": lease_id,
        "resource_type": "physical:host",
        "resource_id": new_id(),
        "status": ReservationStatus.PENDING,
        "missing_resources": False,
        "resources_changed": False,
        "params": {"min": 1, "max": 1},
        "created_at": T0,
    }


def test_a_built_lease_is_the_constructed_one() -> None:
    lease_id = new_id()
    columns, child = lease_columns(lease_id), reservation_columns(lease_id)
    made = Lease(**columns, reservations=[Reservation(**child)], events=[])
    fast = built(Lease, **columns, reservations=[built(Reservation, **child)], events=[])
    assert inspect(fast).transient
    for key in columns:
        assert getattr(fast, key) == getattr(made, key), key
    assert fast.trust_id is None and fast.deleted_at is None  # never set: None, as made
    assert fast.events == [] and len(fast.reservations) == 1
    assert fast.reservations[0].lease is fast  # both sides, as the constructor's backref
    assert fast.reservations[0].params == made.reservations[0].params
    fast.status = LeaseStatus.HELD  # later changes go through the ORM as usual
    assert fast.status == LeaseStatus.HELD


def test_built_rows_added_to_a_session_are_inserted_whole(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    lease_id = new_id()
    with db.transaction() as session:
        lease = built(Lease, **lease_columns(lease_id), events=[])
        lease.reservations.append(built(Reservation, **reservation_columns(lease_id)))
        session.add(lease)
        session.flush()
        # An event appended to a lease in the session, as holds and the queue do.
        lease.events.append(event(lease_id, EventType.END_LEASE, T0 + 2 * HOUR, T0))
    with db.reader() as session:
        stored = session.scalars(select(Lease).where(Lease.id == lease_id)).one()
        assert (stored.name, stored.start_date, stored.degraded) == ("built", T0 + HOUR, False)
        assert [r.params for r in stored.reservations] == [{"min": 1, "max": 1}]
        (end,) = stored.events
        assert (end.event_type, end.time, end.status) == (
            EventType.END_LEASE,
            T0 + 2 * HOUR,
            EventStatus.UNDONE,
        )
        assert end.created_at == T0 and end.lease_id == lease_id
    db.dispose()
