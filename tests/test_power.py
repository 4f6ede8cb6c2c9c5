"""The power policy (docs/power.md): idle hosts are powered down through the backend and woken
ahead of their next lease; a lease never starts on a host still powered down; a host that does
not wake is a failed host, and its reservations are healed."""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from sqlalchemy import select

from climate.backends.base import Action, PowerOff, PowerOn, Result, Start
from climate.backends.faulty import InjectedFault
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.domain.clock import ManualClock
from climate.errors import Forbidden, InvalidInput
from climate.manager.service import Manager
from climate.planner.power import hours_off, plan_power
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.power import PowerService
from tests.conftest import ADMIN, ALICE, T0, LiveServer
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)
POLICY = {
    "power_policy": "act",
    "power_idle_hours": 4.0,
    "power_wake_lead_seconds": 1200.0,
    "power_interval_seconds": 600.0,
    "power_host_watts": 250.0,
}
WAKE_AHEAD = dt.timedelta(seconds=1800)
"""Lead plus interval: a host is woken at the last pass before its lease's lead time."""


@pytest.fixture
def settings() -> Settings:
    return load_settings(env={}, event_retry_base_seconds=0.0, **POLICY)


class PowerWorld(StandaloneBackend):
    """The standalone backend, keeping each host's power as the world would and every start
    made on a host still powered down."""

    def __init__(self, failing_wakes: frozenset[str] = frozenset()) -> None:
        self.off: set[str] = set()
        self.log: list[tuple[str, str]] = []
        self.started_asleep: list[str] = []
        self.failing_wakes = failing_wakes

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results = super().handle(actions)
        for i, action in enumerate(actions):
            if isinstance(action, PowerOff):
                self.off.add(action.host_id)
                self.log.append(("off", action.host_id))
            elif isinstance(action, PowerOn):
                if action.host_id in self.failing_wakes:
                    results[i] = InjectedFault(f"{action.name} does not answer its BMC")
                    continue
                self.off.discard(action.host_id)
                self.log.append(("on", action.host_id))
            elif isinstance(action, Start):
                for handover in action.handovers:
                    for host_id in handover.hosts:
                        self.log.append(("start", host_id))
                        if host_id in self.off:
                            self.started_asleep.append(host_id)
        return results


def only_host(ctx: ServiceContext, leases: LeaseService, lease_id: str) -> str:
    (reservation,) = leases.get(ALICE, lease_id).reservations
    (allocation,) = reservation.allocations
    return str(allocation.host_id)


def test_idle_hosts_power_down_and_the_next_leases_host_wakes_ahead_of_it(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids = [str(i) for i in add_hosts(hosts, 2)]
    lease = leases.create(ALICE, host_request("later", T0 + 10 * HOUR, T0 + 12 * HOUR))
    chosen = only_host(ctx, leases, lease.id)
    world = PowerWorld()
    manager = Manager(ctx, world)

    manager.power()
    assert world.off == set(ids)

    # Not yet within the lead (plus a pass) of the start: it sleeps on.
    clock.set(T0 + 10 * HOUR - WAKE_AHEAD - MINUTE)
    PowerService(ctx, manager.handlers.backend).run()
    assert world.off == set(ids)
    clock.set(T0 + 10 * HOUR - WAKE_AHEAD + MINUTE)
    PowerService(ctx, manager.handlers.backend).run()
    assert world.off == set(ids) - {chosen}

    clock.set(T0 + 10 * HOUR)
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    assert ("start", chosen) in world.log and not world.started_asleep
    with ctx.db.reader() as session:
        actions = session.scalars(
            select(AuditLog.action).where(AuditLog.action.like("host.power%")).order_by(AuditLog.id)
        ).all()
    assert actions == ["host.power_off", "host.power_off", "host.power_on"]


def test_a_lease_starting_now_on_a_powered_down_host_wakes_it_before_the_start(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService
) -> None:
    add_hosts(hosts, 1)
    world = PowerWorld()
    manager = Manager(ctx, world)
    PowerService(ctx, manager.handlers.backend).run()
    assert world.off == {"1"}

    lease = leases.create(ALICE, host_request("now", None, T0 + 2 * HOUR))
    manager.run_due()  # no power pass in between: the start itself wakes the host

    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    assert world.log == [("off", "1"), ("on", "1"), ("start", "1")]
    assert not world.started_asleep


def test_a_start_whose_host_does_not_wake_waits_and_the_host_is_healed_away(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    ids = [str(i) for i in add_hosts(hosts, 2)]
    lease = leases.create(ALICE, host_request("later", T0 + 10 * HOUR, T0 + 12 * HOUR))
    broken = only_host(ctx, leases, lease.id)
    (spare,) = set(ids) - {broken}
    world = PowerWorld(failing_wakes=frozenset({broken}))
    manager = Manager(ctx, world)
    power = PowerService(ctx, manager.handlers.backend)
    power.run()
    assert world.off == set(ids)

    clock.set(T0 + 10 * HOUR - WAKE_AHEAD + MINUTE)
    power.run()  # the wake fails: the host is marked down and the lease moves to the spare
    assert hosts.get(ADMIN, broken).health == "down"
    assert only_host(ctx, leases, lease.id) == spare
    power.run()  # the spare, asleep, now holds a lease within the lead: it wakes
    assert spare not in world.off

    clock.set(T0 + 10 * HOUR)
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    assert not world.started_asleep


def test_the_report_counts_host_hours_off_and_the_energy_they_saved(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    add_hosts(hosts, 2)
    leases.create(ALICE, host_request("later", T0 + 10 * HOUR, T0 + 12 * HOUR))
    world = PowerWorld()
    power = PowerService(ctx, Manager(ctx, world).handlers.backend)
    power.run()  # both off at T0
    clock.set(T0 + 9 * HOUR + 45 * MINUTE)
    power.run()  # the lease's host wakes at T0 + 9:45
    clock.set(T0 + 24 * HOUR)

    report = power.report(ADMIN, T0 - HOUR, T0 + 24 * HOUR)

    # 9.75 h for the woken host, 24 h for the other (still off at the end of the period).
    assert sorted(report.hours_off.values()) == [9.75, 24.0]
    assert report.saved_host_hours == 33.75
    assert report.saved_kwh == pytest.approx(33.75 * 0.25)
    states = {h.state for h in report.hosts}
    assert states == {"on", "off"}


def test_the_report_is_for_admins_and_refuses_an_inverted_period(ctx: ServiceContext) -> None:
    power = PowerService(ctx, Manager(ctx, PowerWorld()).handlers.backend)
    with pytest.raises(Forbidden):
        power.report(ALICE, None, None)
    with pytest.raises(InvalidInput, match="end"):
        power.report(ADMIN, T0, T0 - HOUR)
    with pytest.raises(InvalidInput, match="end"):
        power.report(ADMIN, T0, T0 + dt.timedelta(days=1000))


def test_with_the_policy_off_hosts_left_powered_down_are_woken(
    ctx: ServiceContext, hosts: HostService
) -> None:
    add_hosts(hosts, 2)
    world = PowerWorld()
    PowerService(ctx, Manager(ctx, world).handlers.backend).run()
    assert world.off == {"1", "2"}
    off = build_context(ctx.settings.model_copy(update={"power_policy": "off"}), ctx.db, ctx.clock)
    PowerService(off, Manager(off, world).handlers.backend).run()
    assert world.off == set()


def test_settings_refuse_an_idle_time_shorter_than_the_wake_lead() -> None:
    with pytest.raises(Exception, match="power_idle_hours"):
        load_settings(
            env={}, power_idle_hours=0.25, power_wake_lead_seconds=600, power_interval_seconds=600
        )


def test_the_http_report_names_the_bad_field(settings: Settings, sqlite_url: str) -> None:
    db = Database(sqlite_url)
    try:
        with LiveServer(build_context(settings, db, ManualClock(T0))) as server:
            bad = httpx.get(f"{server.url}/v1/power", params={"start": "tomorrow-ish"})
            assert bad.status_code == 400 and "start" in bad.json()["error_message"]
            ok = httpx.get(f"{server.url}/v1/power")
            assert ok.status_code == 200
            assert ok.json()["power"]["policy"] == "act"
    finally:
        db.dispose()


def test_the_plan_never_powers_down_a_host_it_would_wake() -> None:
    now = T0
    plan = plan_power(
        on=[1, 2, 3],
        off=[4, 5],
        next_busy={1: now + 5 * HOUR, 2: now + HOUR, 4: now + 10 * MINUTE, 5: now + 5 * HOUR},
        now=now,
        idle=4 * HOUR,
        wake_ahead=WAKE_AHEAD,
    )
    assert plan.power_off == (1, 3) and plan.wake == (4,)
    assert hours_off([(1, now, None)], now - HOUR, now + HOUR, now + 30 * MINUTE) == {1: 0.5}


@examples(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    leases_=st.lists(
        st.tuples(st.integers(0, 30 * 60), st.integers(30, 10 * 60)), min_size=1, max_size=8
    ),
    steps=st.lists(st.tuples(st.integers(10, 240), st.booleans()), min_size=5, max_size=30),
)
def test_no_lease_ever_starts_on_a_host_still_powered_down(
    sqlite_template: Path,
    tmp_path: Path,
    settings: Settings,
    leases_: list[tuple[int, int]],
    steps: list[tuple[int, bool]],
) -> None:
    """Random leases (start, length in minutes) on three hosts; a fake clock moves in random
    steps, after each of which the manager may or may not get to its power pass (a late or
    busy manager) before it applies the due events."""
    path = tmp_path / f"{uuid.uuid4().hex}.db"
    shutil.copy(sqlite_template, path)
    db = Database(f"sqlite:///{path}")
    clock = ManualClock(T0)
    ctx = build_context(settings, db, clock)
    try:
        add_hosts(HostService(ctx), 3)
        service = LeaseService(ctx)
        for i, (start, length) in enumerate(leases_):
            begin = T0 + dt.timedelta(minutes=start)
            try:
                service.create(
                    ALICE, host_request(f"l{i}", begin, begin + dt.timedelta(minutes=length))
                )
            except Exception:
                pass  # no host free for that window: another lease is as good a test
        world = PowerWorld()
        manager = Manager(ctx, world)
        power = PowerService(ctx, manager.handlers.backend)
        for minutes, pass_runs in steps:
            if pass_runs:
                power.run()
            clock.advance(dt.timedelta(minutes=minutes))
            manager.run_due()
        assert world.started_asleep == []
    finally:
        db.dispose()
