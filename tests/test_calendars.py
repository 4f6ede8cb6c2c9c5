"""The in-memory calendar admission reads: busy spans, the gaps around a window, and how it keeps
in step with the database across processes and rollbacks."""

from __future__ import annotations

import datetime as dt

import pytest

from climate.config import Settings
from climate.db import hosts as host_rows
from climate.db.engine import ADMISSION_LOCK, Database
from climate.domain.clock import ManualClock
from climate.errors import NotEnoughCapacity
from climate.planner.calendar import HostSet
from climate.resources.hosts import PhysicalHostType
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseRequest, LeaseService, ReservationRequest
from tests.conftest import ALICE, BOB, T0
from tests.helpers import add_hosts, host_request, hosts_of

HOUR = dt.timedelta(hours=1)


def _view(ctx: ServiceContext, start: dt.datetime, end: dt.datetime, exclude: list[str]):
    host_type = ctx.resource_types["physical:host"]
    assert isinstance(host_type, PhysicalHostType)
    with ctx.db.transaction(lock=ADMISSION_LOCK) as session:
        records = host_rows.reservable_records(session, ("hypervisor_hostname",))
        hosts = HostSet((r.id, r.hypervisor_hostname) for r in records)
        return list(host_type.calendar.view(session, hosts, start, end, exclude))


def test_calendar_shows_overlaps_and_the_nearest_allocations_on_each_side(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    (host,) = add_hosts(hosts, 1)
    add_hosts(hosts, 1, prefix="idle")
    leases.create(ALICE, host_request("long-before", T0 + HOUR, T0 + 2 * HOUR))
    leases.create(ALICE, host_request("just-before", T0 + 2 * HOUR, T0 + 3 * HOUR))
    inside = leases.create(ALICE, host_request("inside", T0 + 4 * HOUR, T0 + 5 * HOUR))
    leases.create(ALICE, host_request("just-after", T0 + 7 * HOUR, T0 + 8 * HOUR))
    leases.create(ALICE, host_request("long-after", T0 + 9 * HOUR, T0 + 10 * HOUR))
    window = (T0 + 3 * HOUR, T0 + 7 * HOUR)
    busy, idle = _view(ctx, *window, [])
    (excluded, _) = _view(ctx, *window, [inside.reservations[0].id])
    assert busy.host_id == host
    assert busy.busy == ((T0 + 4 * HOUR, T0 + 5 * HOUR),)
    # An allocation ending exactly at the window's start, and one starting exactly at its end,
    # touch the window without overlapping it.
    assert (busy.previous_end, busy.next_start) == (T0 + 3 * HOUR, T0 + 7 * HOUR)
    assert busy.fit(*window) == dt.timedelta(0)
    assert (idle.busy, idle.previous_end, idle.next_start) == ((), None, None)
    assert excluded.free


def test_another_process_admission_is_seen_before_the_next_decision(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    here, there = build_context(settings, db, clock), build_context(settings, db, clock)
    add_hosts(HostService(here), 1)
    mine, theirs = LeaseService(here), LeaseService(there)
    mine.create(ALICE, host_request("warm-up", T0 + 10 * HOUR, T0 + 11 * HOUR))  # cache loaded
    theirs.create(BOB, host_request("elsewhere", T0, T0 + HOUR))
    with pytest.raises(NotEnoughCapacity):
        mine.create(ALICE, host_request("clash", T0, T0 + HOUR))
    theirs.delete(BOB, theirs.list_all(BOB)[0].id)  # and a release is seen too
    assert hosts_of(mine.create(ALICE, host_request("now-free", T0, T0 + HOUR)))


def test_a_refused_lease_leaves_nothing_behind_in_the_calendar(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    one = {"min": 1, "max": 1, "hypervisor_properties": "", "resource_properties": ""}
    # The first reservation fits and is written; the second does not, so the whole lease is
    # refused and the first one's allocation must vanish from memory as from the database.
    too_many = {**one, "min": 5, "max": 5}
    request = LeaseRequest(
        "two-parts",
        T0,
        T0 + HOUR,
        reservations=[
            ReservationRequest("physical:host", one),
            ReservationRequest("physical:host", too_many),
        ],
    )
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, request)
    assert all(c.free for c in _view(ctx, T0, T0 + HOUR, []))
    both = leases.create(ALICE, host_request("both", T0, T0 + HOUR, 2, 2))
    assert len(hosts_of(both)) == 2
