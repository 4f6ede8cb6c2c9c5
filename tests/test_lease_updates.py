"""Updating and deleting leases: every new shape is re-admitted atomically."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from climate.db.engine import ADMISSION_LOCK
from climate.domain.clock import ManualClock
from climate.errors import Conflict, InvalidInput, NotEnoughCapacity, NotFound
from climate.runtime import build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService, ReservationRequest
from tests.conftest import ALICE, BOB, T0
from tests.helpers import add_hosts, host_request, hosts_of

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


def _snapshot(leases: LeaseService, lease_id: str) -> tuple[object, ...]:
    lease = leases.get(ALICE, lease_id)
    return (
        lease.name,
        lease.start_date,
        lease.end_date,
        [r.params for r in lease.reservations],
        sorted(hosts_of(lease)),
        sorted((e.event_type, e.time) for e in lease.events),
    )


def test_extending_into_another_lease_is_refused_and_nothing_changes(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    first = leases.create(ALICE, host_request("first", T0 + HOUR, T0 + 2 * HOUR))
    leases.create(BOB, host_request("second", T0 + 3 * HOUR, T0 + 4 * HOUR))
    before = _snapshot(leases, first.id)
    with pytest.raises(NotEnoughCapacity, match="Not enough hosts available"):
        leases.update(ALICE, first.id, LeaseChanges(name="renamed", end=T0 + 3 * HOUR + HOUR / 2))
    assert _snapshot(leases, first.id) == before


def test_moving_a_pending_lease_keeps_its_hosts_when_they_stay_free(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 4)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR, 2, 2))
    held = hosts_of(lease)
    moved = leases.update(ALICE, lease.id, LeaseChanges(start=T0 + 5 * HOUR, end=T0 + 6 * HOUR))
    assert hosts_of(moved) == held
    assert (moved.start_date, moved.end_date) == (T0 + 5 * HOUR, T0 + 6 * HOUR)
    times = {e.event_type: e.time for e in moved.events}
    assert times == {
        "start_lease": T0 + 5 * HOUR,
        "before_end_lease": T0 + 5 * HOUR,
        "end_lease": T0 + 6 * HOUR,
    }


def test_raising_max_takes_more_hosts_and_min_above_free_is_refused(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 3)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR, 1, 1))
    rid = lease.reservations[0].id
    grown = leases.update(
        ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, {"max": 3}, rid)])
    )
    assert len(hosts_of(grown)) == 3
    assert grown.reservations[0].params["max"] == 3
    with pytest.raises(InvalidInput, match="max"):
        leases.update(
            ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, {"min": 4}, rid)])
        )
    with pytest.raises(InvalidInput, match="Missing parameter reservation ID"):
        leases.update(
            ALICE, lease.id, LeaseChanges(reservations=[ReservationRequest(None, {"max": 2})])
        )


def test_active_lease_can_be_extended_but_its_start_cannot_move(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + HOUR))
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    with pytest.raises(InvalidInput, match="Cannot modify the start date of already started"):
        leases.update(ALICE, lease.id, LeaseChanges(start=T0 + HOUR))
    longer = leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * HOUR))
    assert longer.status == "ACTIVE"
    assert longer.end_date == T0 + 3 * HOUR
    clock.set(T0 + HOUR)
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    clock.set(T0 + 3 * HOUR)
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "TERMINATED"


def test_active_lease_keeps_its_hosts_when_extended_and_refuses_if_they_are_booked(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + HOUR))
    manager.run_due()
    (mine,) = hosts_of(leases.get(ALICE, lease.id))
    # Book the other host too after our end, then our own host: extending must not move us.
    leases.create(BOB, host_request("b", T0 + HOUR, T0 + 2 * HOUR, 2, 2))
    with pytest.raises(NotEnoughCapacity, match="active hosts cannot be moved"):
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 90 * dt.timedelta(minutes=1)))
    assert hosts_of(leases.get(ALICE, lease.id)) == {mine}


def test_a_running_lease_that_grows_holds_each_new_host_from_then_on(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """As healing dates a spare: a host added to a running reservation is held from when it
    was added (allocation calendars and usage must not claim it earlier), so it need only be
    free from then on; the hosts it held keep their dates."""
    add_hosts(hosts, 3)
    manager = build_workers(ctx).manager
    leases.create(BOB, host_request("b", T0, T0 + 30 * MINUTE))
    lease = leases.create(ALICE, host_request("l", T0, T0 + 2 * HOUR))
    manager.run_due()
    (mine,) = hosts_of(leases.get(ALICE, lease.id))
    clock.set(T0 + HOUR)
    manager.run_due()  # Bob's lease has ended: his host is free from T0 + 30 min on
    rid = lease.reservations[0].id

    def grow(count: int) -> list[tuple[int, dt.datetime, dt.datetime]]:
        more = ReservationRequest(None, {"min": count, "max": count}, rid)
        grown = leases.update(ALICE, lease.id, LeaseChanges(reservations=[more]))
        dates = sorted(
            (a.start_date, a.host_id, a.end_date) for a in grown.reservations[0].allocations
        )
        shown = leases.get(ALICE, lease.id).reservations[0].allocations
        assert sorted((a.start_date, a.host_id, a.end_date) for a in shown) == dates
        return dates

    second = grow(2)
    assert [(s, e) for s, _, e in second] == [(T0, T0 + 2 * HOUR), (T0 + HOUR, T0 + 2 * HOUR)]
    assert second[0][1] == mine
    clock.set(T0 + 90 * MINUTE)
    third = grow(3)  # Bob's host, busy before now, is taken
    assert third[:2] == second
    assert third[2][0] == T0 + 90 * MINUTE and third[2][2] == T0 + 2 * HOUR


def test_deleting_an_active_lease_ends_it_now_and_frees_its_hosts(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + 5 * HOUR))
    manager.run_due()
    clock.set(T0 + HOUR)
    leases.delete(ALICE, lease.id)
    with pytest.raises(NotFound):
        leases.get(ALICE, lease.id)
    manager.run_due()
    from climate.db.tables import Lease

    with ctx.db.reader() as session:
        row = session.get(Lease, lease.id)
        assert row is not None
        assert (row.status, row.deleted_at) == ("TERMINATED", T0 + HOUR)
        assert [a.end_date for r in row.reservations for a in r.allocations] == [T0 + HOUR]
    # The host is free from now on.
    leases.create(BOB, host_request("after", T0 + HOUR, T0 + 2 * HOUR))


def test_deleting_a_pending_lease_frees_its_window_at_once(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    leases.delete(ALICE, lease.id)
    leases.create(BOB, host_request("same-window", T0 + HOUR, T0 + 2 * HOUR))
    assert leases.list_all(ALICE) == []


def test_name_is_unique_per_project_among_live_leases(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 2)
    first = leases.create(ALICE, host_request("same", T0 + HOUR, T0 + 2 * HOUR))
    with pytest.raises(Conflict, match="already exists"):
        leases.create(ALICE, host_request("same", T0 + HOUR, T0 + 2 * HOUR))
    leases.create(BOB, host_request("same", T0 + HOUR, T0 + 2 * HOUR))  # another project
    leases.delete(ALICE, first.id)
    leases.create(ALICE, host_request("same", T0 + HOUR, T0 + 2 * HOUR))


def test_two_admissions_of_one_name_at_once_admit_one_and_refuse_the_other(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService
) -> None:
    """The name is the database's unique index: on PostgreSQL the second insert of the name
    waits for the first admission to end, then fails; on SQLite the writers take turns."""
    add_hosts(hosts, 2)
    outcomes: list[str] = []

    def create() -> None:
        try:
            leases.create(ALICE, host_request("same", T0 + HOUR, T0 + 2 * HOUR))
            outcomes.append("admitted")
        except Conflict as refused:
            outcomes.append(str(refused))

    with ctx.db.transaction(lock=ADMISSION_LOCK):  # both wait, each with its lease row written
        racers = [threading.Thread(target=create) for _ in range(2)]
        for racer in racers:
            racer.start()
        time.sleep(0.3)
    for racer in racers:
        racer.join(timeout=30)
    assert sorted(outcomes) == [
        "admitted",
        f"name: a lease named 'same' already exists in project {ALICE.project_id}",
    ]
    assert [lease.name for lease in leases.list_all(ALICE)] == ["same"]


def test_an_ended_lease_can_be_renamed_and_nothing_else(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0, T0 + HOUR))
    clock.set(T0 + HOUR)
    build_workers(ctx).manager.run_due()
    renamed = leases.update(ALICE, lease.id, LeaseChanges(name="late"))
    assert (renamed.name, renamed.status, renamed.end_date) == ("late", "TERMINATED", T0 + HOUR)
    with pytest.raises(InvalidInput, match="Terminated leases can only be renamed"):
        leases.update(ALICE, lease.id, LeaseChanges(name="later", end=T0 + 3 * HOUR))
    # A new start is refused as for any lease that started, as Blazar does (it looks at the
    # start first): `blazar lease-update --defer-by 1h` says so.
    for moved in (
        LeaseChanges(start=T0 + 2 * HOUR, end=T0 + 3 * HOUR),
        LeaseChanges(start_now=True),
    ):
        with pytest.raises(
            InvalidInput, match="Cannot modify the start date of already started leases"
        ):
            leases.update(ALICE, lease.id, moved)
    assert leases.get(ALICE, lease.id).name == "late"


def test_an_empty_update_answers_the_lease_as_it_is(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    before = _snapshot(leases, lease.id)
    assert leases.update(ALICE, lease.id, LeaseChanges()).id == lease.id
    assert _snapshot(leases, lease.id) == before


def test_a_started_lease_keeps_its_start_and_may_end_now(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + 3 * HOUR))
    clock.set(T0 + HOUR)
    manager.run_due()
    same = leases.update(ALICE, lease.id, LeaseChanges(start=T0, end=T0 + 4 * HOUR))
    assert (same.start_date, same.end_date) == (T0, T0 + 4 * HOUR)  # its own start: no move
    with pytest.raises(InvalidInput, match="Cannot modify the start date of already started"):
        leases.update(ALICE, lease.id, LeaseChanges(start=T0 + 2 * HOUR))
    with pytest.raises(InvalidInput, match="End date must be later than current and start date"):
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + HOUR / 2))
    ended = leases.update(ALICE, lease.id, LeaseChanges(end_now=True))
    assert ended.end_date == T0 + HOUR
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "TERMINATED"


def test_a_started_lease_given_the_current_minute_as_its_end_ends_now(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """As Blazar, which compares an end with "now" to the minute: `blazar lease-update
    --end-date "$(date -u '+%Y-%m-%d %H:%M')"` (the CLI takes minutes, not "now") ends a running
    lease now; the minute before is still refused."""
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + 3 * HOUR))
    now = T0 + HOUR + 30 * dt.timedelta(seconds=1)
    clock.set(now)
    manager.run_due()
    with pytest.raises(InvalidInput, match="End date must be later than current and start date"):
        leases.update(ALICE, lease.id, LeaseChanges(end=T0 + HOUR - MINUTE))
    ended = leases.update(ALICE, lease.id, LeaseChanges(end=T0 + HOUR))
    assert ended.end_date == now
    assert {e.event_type: e.time for e in ended.events}["end_lease"] == now
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "TERMINATED"


def test_a_lease_not_started_cannot_end_now(hosts: HostService, leases: LeaseService) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    with pytest.raises(InvalidInput, match="End date must be later than current and start date"):
        leases.update(ALICE, lease.id, LeaseChanges(end_now=True))


def test_members_cannot_see_or_touch_other_projects_leases(
    hosts: HostService, leases: LeaseService
) -> None:
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("l", T0 + HOUR, T0 + 2 * HOUR))
    for call in (
        lambda: leases.get(BOB, lease.id),
        lambda: leases.update(BOB, lease.id, LeaseChanges(name="x")),
        lambda: leases.delete(BOB, lease.id),
    ):
        with pytest.raises(NotFound):
            call()
    assert leases.list_all(BOB) == []
    assert [x.id for x in leases.list_all(ALICE)] == [lease.id]


def test_extending_after_the_warning_warns_again_before_the_new_end(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + 2 * HOUR))
    clock.set(T0 + HOUR)
    manager.run_due()  # started and warned
    extended = leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 5 * HOUR))
    warnings = [e for e in extended.events if e.event_type == "before_end_lease"]
    assert sorted((e.status, e.time) for e in warnings) == [
        ("DONE", T0 + HOUR),
        ("UNDONE", T0 + 4 * HOUR),
    ]
    clock.set(T0 + 4 * HOUR)
    assert manager.run_due() == 1


def test_an_end_brought_forward_after_the_warning_warns_again_at_once(
    ctx: ServiceContext, hosts: HostService, leases: LeaseService, clock: ManualClock
) -> None:
    """As Blazar: the warning's time relative to the new end has passed, so it runs again now
    (its before-end action too), before the end."""
    add_hosts(hosts, 1)
    manager = build_workers(ctx).manager
    lease = leases.create(ALICE, host_request("l", T0, T0 + 4 * HOUR))  # warned 1 h before
    clock.set(T0 + 3 * HOUR + 10 * MINUTE)
    manager.run_due()  # started and warned
    shortened = leases.update(ALICE, lease.id, LeaseChanges(end=T0 + 3 * HOUR + 30 * MINUTE))
    warnings = [e for e in shortened.events if e.event_type == "before_end_lease"]
    assert sorted((e.status, e.time) for e in warnings) == [
        ("DONE", T0 + 3 * HOUR),
        ("UNDONE", T0 + 2 * HOUR + 30 * MINUTE),
    ]
    assert manager.run_due() == 1  # the new warning, at once
    unchanged = leases.update(ALICE, lease.id, LeaseChanges(name="renamed"))
    assert [e.status for e in unchanged.events if e.event_type == "before_end_lease"] == [
        "DONE",
        "DONE",
    ]
    clock.set(T0 + 3 * HOUR + 30 * MINUTE)
    assert manager.run_due() == 1  # the end
    assert leases.get(ALICE, lease.id).status == "TERMINATED"
