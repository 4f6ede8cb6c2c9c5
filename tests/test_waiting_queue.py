"""The waiting queue's order and timers, on a manual clock: the manager serves it only when
capacity may have freed or a timer is due."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from climate.domain.clock import ManualClock
from climate.domain.status import LeaseType
from climate.errors import Forbidden
from climate.manager.service import Manager
from climate.runtime import build_workers
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import add_hosts, host_request, queue_places

HOUR = dt.timedelta(hours=1)


def hunt(leases: LeaseService, name: str, actor: object = ALICE, **extra: object) -> str:
    request = dataclasses.replace(
        host_request(name, None, T0 + HOUR),
        lease_type=LeaseType.BEST_EFFORT,
        deadline=T0 + 10 * HOUR,
        **extra,
    )
    lease = leases.create(actor, request)  # type: ignore[arg-type]
    assert lease.status == "IN_PROGRESS"
    return lease.id


@pytest.fixture
def manager(ctx: ServiceContext, hosts: HostService, leases: LeaseService) -> Manager:
    add_hosts(hosts, 1)
    leases.create(BOB, host_request("occupant", None, T0 + 2 * HOUR))
    manager = build_workers(ctx).manager
    assert manager.run_due() == 1  # the occupant starts
    return manager


def test_queue_order_is_priority_then_request_time_then_id(
    manager: Manager, leases: LeaseService, clock: ManualClock
) -> None:
    early = hunt(leases, "early")
    clock.advance(dt.timedelta(seconds=1))
    late = hunt(leases, "late")
    urgent = hunt(leases, "urgent", actor=ADMIN, priority=2)
    low = hunt(leases, "low", priority=-1)
    assert queue_places(leases) == {urgent: 1, early: 2, late: 3, low: 4}


def test_members_cannot_raise_their_priority(manager: Manager, leases: LeaseService) -> None:
    with pytest.raises(Forbidden):
        hunt(leases, "pushy", priority=1)


def test_best_effort_is_tried_again_only_when_capacity_may_have_freed(
    manager: Manager, leases: LeaseService, clock: ManualClock
) -> None:
    waiting = hunt(leases, "hunt")
    assert manager.serve_queue() == 0  # the first look: capacity unknown since start
    attempts = leases.get(ALICE, waiting).attempts
    assert manager.serve_queue() == 0
    assert leases.get(ALICE, waiting).attempts == attempts  # nothing changed: not tried
    # Waiting for a deadline ten hours off, but looking now and then for unannounced frees.
    assert manager.seconds_until_next() == manager.ctx.settings.queue_poll_seconds
    clock.set(T0 + 2 * HOUR)
    assert manager.run_due() == 2  # the occupant is warned and ends
    assert manager.serve_queue() == 1  # an end frees capacity: the queue looks again
    lease = leases.get(ALICE, waiting)
    assert (lease.status, lease.start_date, lease.end_date) == (
        "PENDING",
        T0 + 2 * HOUR,
        T0 + 3 * HOUR,  # the requested hour, from its admission
    )
    manager.run_due()
    assert leases.get(ALICE, waiting).status == "ACTIVE"


def test_retry_attempts_come_at_their_interval(
    manager: Manager, leases: LeaseService, clock: ManualClock
) -> None:
    request = dataclasses.replace(
        host_request("retry", None, T0 + HOUR), lease_type=LeaseType.RETRY, retries=3
    )
    waiting = leases.create(ALICE, request)
    interval = dt.timedelta(seconds=manager.ctx.settings.retry_interval_seconds)
    assert waiting.next_attempt_at == T0 + interval
    clock.advance(interval - dt.timedelta(seconds=5))
    assert manager.seconds_until_next() == pytest.approx(5)  # sleeps until the next attempt
    manager.serve_queue()
    assert leases.get(ALICE, waiting.id).attempts == 1  # not due yet
    clock.advance(dt.timedelta(seconds=5))
    manager.serve_queue()
    assert leases.get(ALICE, waiting.id).attempts == 2
    clock.advance(interval)
    manager.serve_queue()
    failed = leases.get(ALICE, waiting.id)
    assert (failed.status, failed.attempts) == ("ERROR", 3)
    assert failed.next_attempt_at is None
    # Nothing left to retry: the manager waits only for the occupant's events, an hour off.
    assert manager.seconds_until_next() == manager.ctx.settings.max_wait_seconds
