"""Waking the manager: only for an event earlier than the one it already waits for.

Services tell the manager the earliest event they added or moved (in-process after commit, and
over PostgreSQL NOTIFY with the time as payload). A far-future lease must not cost a manager
pass; an earlier one, or a wake-up while the manager is reading the queue, must never be lost.
"""

from __future__ import annotations

import datetime as dt

import pytest

from climate.backends.standalone import StandaloneBackend
from climate.db.wakeup import _when
from climate.errors import NotEnoughCapacity
from climate.manager.service import NOTHING_DUE, Manager
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)


def manager_waiting_for(ctx: ServiceContext) -> Manager:
    manager = Manager(ctx, StandaloneBackend(), name="m")
    manager.seconds_until_next()  # reads the queue, as every pass ends
    return manager


def test_later_events_do_not_wake_the_manager(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    add_hosts(hosts, 2)
    first = leases.create(ALICE, host_request("first", T0 + HOUR, T0 + 2 * HOUR))
    manager = manager_waiting_for(ctx)
    assert manager._expecting == first.start_date

    manager.wake(T0 + 3 * HOUR)
    assert not manager._wake.is_set()
    manager.wake(first.start_date)
    assert not manager._wake.is_set()
    manager.wake(T0 + HOUR / 2)
    assert manager._wake.is_set()


def test_an_empty_queue_wakes_for_any_event(ctx: ServiceContext) -> None:
    manager = manager_waiting_for(ctx)
    assert manager._expecting == NOTHING_DUE
    manager.wake(T0 + 1000 * HOUR)
    assert manager._wake.is_set()


def test_wakeups_without_a_time_and_during_a_read_always_count(ctx: ServiceContext) -> None:
    manager = Manager(ctx, StandaloneBackend(), name="m")
    manager._expecting = None  # as while seconds_until_next reads the queue
    manager.wake(T0 + 1000 * HOUR)
    assert manager._wake.is_set()

    manager = manager_waiting_for(ctx)
    manager.wake(None)  # SQLite's change counter says nothing about when
    assert manager._wake.is_set()


def test_services_pass_the_earliest_changed_event(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    add_hosts(hosts, 1)
    told: list[dt.datetime] = []
    ctx.wake_manager = told.append
    lease = leases.create(ALICE, host_request("a", T0 + 5 * HOUR, T0 + 6 * HOUR))
    assert told == [T0 + 5 * HOUR]
    # A refused lease commits nothing and wakes nobody.
    with pytest.raises(NotEnoughCapacity):
        leases.create(ALICE, host_request("b", T0 + 5 * HOUR, T0 + 6 * HOUR))
    assert told == [T0 + 5 * HOUR]
    leases.delete(ALICE, lease.id)  # pending: its events are dropped, nothing to run
    assert told == [T0 + 5 * HOUR]


def test_notify_payload_is_read_back() -> None:
    when = dt.datetime(2030, 1, 1, 12, tzinfo=dt.UTC)
    assert _when(when.isoformat()) == when
    assert _when("") is None
    assert _when("not a time") is None
