"""Idle reclamation (docs/idle.md): a running lease without a sign of use is warned after
``idle_warning_hours`` and ended after ``idle_release_hours``, counted from the later of its start
and its last sign of use (a heartbeat, or the backend seeing it in use); once per idle stretch;
exempt projects never; a failed probe decides nothing. On a manual clock."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator, Sequence

import httpx
import pytest
from sqlalchemy import select, update

from climate.backends.base import Action, InspectUsage, Result, Usage
from climate.backends.faulty import FaultyBackend
from climate.backends.standalone import StandaloneBackend
from climate.cli.main import main
from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.db.records import AuditLog
from climate.db.tables import Event, OutboxMessage
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.errors import Conflict, Forbidden, InvalidInput, NotFound
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.idle import IdlePass, IdleService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0, serve
from tests.helpers import add_hosts, host_request

HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)
HOOK = "http://127.0.0.1:9/hook"
POLICY = {
    "idle_reclaim": True,
    "idle_warning_hours": 4.0,
    "idle_release_hours": 6.0,
    "webhooks": HOOK,
}
READER = Actor("rita", "project-a", frozenset({"reader"}))


@pytest.fixture
def settings() -> Settings:
    return load_settings(env={}, event_retry_base_seconds=0.0, **POLICY)


class World(StandaloneBackend):
    """The standalone backend, but the world says which reservations are in use (``busy``:
    reservation ids) and counts the probes."""

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.probes = 0
        self.during_probe: Callable[[], object] = lambda: None
        """What happens in the world while the backend looks (a heartbeat, a crash)."""

    def handle(self, actions: Sequence[Action]) -> list[Result]:
        results = super().handle(actions)
        for i, action in enumerate(actions):
            if isinstance(action, InspectUsage):
                self.probes += 1
                self.during_probe()
                results[i] = Usage(
                    {h.reservation_id: h.reservation_id in self.busy for h in action.handovers}
                )
        return results


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def manager(ctx: ServiceContext, world: World) -> Manager:
    return Manager(ctx, world)


@pytest.fixture
def running(ctx: ServiceContext, leases: LeaseService, hosts: HostService, manager: Manager) -> str:
    """A lease of one host of ALICE's project, started at T0, ending two days later."""
    add_hosts(hosts, 2)
    lease = leases.create(ALICE, host_request("busy-or-not", T0, T0 + 48 * HOUR))
    manager.run_due()
    assert leases.get(ALICE, lease.id).status == "ACTIVE"
    return lease.id


def look(ctx: ServiceContext, manager: Manager, at: dt.datetime) -> IdlePass:
    clock = ctx.clock
    assert isinstance(clock, ManualClock)
    clock.set(at)
    return IdleService(ctx, manager.handlers.backend).run()


def audited(ctx: ServiceContext, lease_id: str) -> list[str]:
    with ctx.db.reader() as session:
        query = select(AuditLog.action).where(
            AuditLog.target_id == lease_id, AuditLog.action.like("lease.idle.%")
        )
        return list(session.scalars(query.order_by(AuditLog.id)))


def notified(ctx: ServiceContext, lease_id: str) -> list[str]:
    with ctx.db.reader() as session:
        query = select(OutboxMessage.topic).where(OutboxMessage.lease_id == lease_id)
        return list(session.scalars(query.order_by(OutboxMessage.id)))


def test_warned_at_n_hours_idle_and_released_at_m_through_the_normal_end(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, running: str
) -> None:
    assert look(ctx, manager, T0 + 4 * HOUR - MINUTE) == IdlePass()
    assert audited(ctx, running) == []

    assert look(ctx, manager, T0 + 4 * HOUR).warned == (running,)
    assert audited(ctx, running) == ["lease.idle.warning"]
    assert notified(ctx, running)[-1] == "lease.idle.warning"
    with ctx.db.reader() as session:
        detail = session.scalars(select(AuditLog.detail).where(AuditLog.target_id == running))
        warning = [d for d in detail if d and "release_at" in d]
    assert (T0 + 6 * HOUR).isoformat() in warning[0]

    assert look(ctx, manager, T0 + 6 * HOUR - MINUTE) == IdlePass()
    assert leases.get(ALICE, running).status == "ACTIVE"

    assert look(ctx, manager, T0 + 6 * HOUR).released == (running,)
    assert audited(ctx, running) == ["lease.idle.warning", "lease.idle.release"]
    lease = leases.get(ALICE, running)
    assert lease.status_reason == "released: idle for 6.0 h"
    (end,) = [e for e in lease.events if e.event_type == "end_lease"]
    assert end.time == T0 + 6 * HOUR  # the end through the backend, due now
    manager.run_due()
    lease = leases.get(ALICE, running)
    assert lease.status == "TERMINATED"
    allocation = lease.reservations[0].allocations
    assert all(a.end_date == T0 + 6 * HOUR for a in allocation)  # the host is free from now
    assert notified(ctx, running)[-2:] == ["lease.idle.release", "lease.end"]
    # An ended lease is no longer watched.
    assert look(ctx, manager, T0 + 20 * HOUR) == IdlePass()


def test_one_warning_per_idle_stretch_and_a_heartbeat_starts_a_new_one(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, running: str
) -> None:
    assert look(ctx, manager, T0 + 4 * HOUR).warned == (running,)
    assert look(ctx, manager, T0 + 5 * HOUR) == IdlePass()  # warned once, not every pass

    beat = IdleService(ctx).heartbeat(ALICE, running)
    assert (beat.at, beat.warning_at, beat.release_at) == (
        T0 + 5 * HOUR,
        T0 + 9 * HOUR,
        T0 + 11 * HOUR,
    )
    # The release the warning announced does not come: the lease was used since.
    assert look(ctx, manager, T0 + 6 * HOUR) == IdlePass()
    assert look(ctx, manager, T0 + 9 * HOUR - MINUTE) == IdlePass()
    assert look(ctx, manager, T0 + 9 * HOUR).warned == (running,)
    assert look(ctx, manager, T0 + 11 * HOUR - MINUTE) == IdlePass()
    assert look(ctx, manager, T0 + 11 * HOUR).released == (running,)
    assert audited(ctx, running) == ["lease.idle.warning"] * 2 + ["lease.idle.release"]


def test_the_backend_seeing_the_lease_in_use_counts_as_a_sign_of_use(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, world: World, running: str
) -> None:
    reservation = leases.get(ALICE, running).reservations[0].id
    world.busy.add(reservation)
    assert look(ctx, manager, T0 + 5 * HOUR).in_use == (running,)
    assert look(ctx, manager, T0 + 7 * HOUR).in_use == (running,)
    world.busy.clear()
    assert look(ctx, manager, T0 + 11 * HOUR - MINUTE) == IdlePass()
    assert look(ctx, manager, T0 + 11 * HOUR).warned == (running,)
    assert world.probes == 4


def test_a_release_always_comes_the_gap_after_its_warning(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, running: str
) -> None:
    """Idle reclamation switched on (or a manager down) long after the lease went idle: it is
    warned first, and ended only ``release - warning`` hours after the warning."""
    assert look(ctx, manager, T0 + 10 * HOUR).warned == (running,)
    assert look(ctx, manager, T0 + 12 * HOUR - MINUTE) == IdlePass()
    assert look(ctx, manager, T0 + 12 * HOUR).released == (running,)


def test_a_heartbeat_during_the_probe_is_not_overlooked(
    ctx: ServiceContext, manager: Manager, world: World, running: str
) -> None:
    world.during_probe = lambda: IdleService(ctx).heartbeat(ALICE, running)
    assert look(ctx, manager, T0 + 4 * HOUR) == IdlePass()
    assert audited(ctx, running) == []


def test_a_probe_that_raises_decides_nothing(
    ctx: ServiceContext, manager: Manager, world: World, running: str
) -> None:
    def cloud_down() -> None:
        raise ConnectionError("nova unreachable")

    world.during_probe = cloud_down
    assert look(ctx, manager, T0 + 10 * HOUR) == IdlePass()
    assert audited(ctx, running) == []


def test_a_lease_whose_event_a_manager_runs_is_released_at_a_later_look(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, running: str
) -> None:
    assert look(ctx, manager, T0 + 4 * HOUR).warned == (running,)
    with ctx.db.transaction() as session:
        (end,) = session.scalars(
            select(Event).where(Event.lease_id == running, Event.event_type == "end_lease")
        )
        end.status, end.claimed_by = "IN_PROGRESS", "another-manager"
        end.claimed_until = T0 + 7 * HOUR
    assert look(ctx, manager, T0 + 6 * HOUR) == IdlePass()
    assert leases.get(ALICE, running).status == "ACTIVE"
    with ctx.db.transaction() as session:
        session.execute(
            update(Event)
            .where(Event.lease_id == running, Event.event_type == "end_lease")
            .values(status="UNDONE", claimed_by=None, claimed_until=None)
        )
    assert look(ctx, manager, T0 + 6 * HOUR + MINUTE).released == (running,)


def test_exempt_projects_are_never_warned_nor_released(
    settings: Settings, db: Database, clock: ManualClock, world: World
) -> None:
    ctx = build_context(
        settings.model_copy(update={"idle_exempt_projects": ("project-a",)}), db, clock
    )
    add_hosts(HostService(ctx), 2)
    leases = LeaseService(ctx)
    hers = leases.create(ALICE, host_request("exempt", T0, T0 + 48 * HOUR))
    his = leases.create(BOB, host_request("not-exempt", T0, T0 + 48 * HOUR))
    manager = Manager(ctx, world)
    manager.run_due()
    assert look(ctx, manager, T0 + 4 * HOUR).warned == (his.id,)
    assert look(ctx, manager, T0 + 40 * HOUR).released == (his.id,)
    assert audited(ctx, hers.id) == []
    assert leases.get(ALICE, hers.id).status == "ACTIVE"
    beat = IdleService(ctx).heartbeat(ALICE, hers.id)
    assert (beat.warning_at, beat.release_at) == (None, None)


def test_a_lease_an_admin_exempted_is_never_warned_nor_released_until_watched_again(
    ctx: ServiceContext, leases: LeaseService, manager: Manager, running: str
) -> None:
    idle = IdleService(ctx)
    with pytest.raises(Forbidden, match="climate:leases:idle_exempt"):
        idle.exempt(ALICE, running, True)  # the lessee may not opt itself out
    with pytest.raises(NotFound):
        idle.exempt(ADMIN, "no-such-lease", True)
    state = idle.exempt(ADMIN, running, True)
    assert (state.lease_id, state.exempt, state.warned_at) == (running, True, None)
    assert look(ctx, manager, T0 + 40 * HOUR) == IdlePass()
    assert idle.heartbeat(ALICE, running).release_at is None
    assert idle.exempt(ADMIN, running, False).last_used_at == T0 + 40 * HOUR
    assert look(ctx, manager, T0 + 44 * HOUR).warned == (running,)
    with ctx.db.reader() as session:
        query = select(AuditLog.action).where(AuditLog.target_id == running)
        actions = list(session.scalars(query.order_by(AuditLog.id)))
    assert actions[-3:] == ["lease.idle.exempt", "lease.idle.exempt", "lease.idle.warning"]


def test_only_the_resource_types_in_scope_are_watched(
    settings: Settings, db: Database, clock: ManualClock, world: World
) -> None:
    scoped = settings.model_copy(update={"idle_resource_types": ("virtual:instance",)})
    ctx = build_context(scoped, db, clock)
    add_hosts(HostService(ctx), 1)
    lease = LeaseService(ctx).create(ALICE, host_request("hosts", T0, T0 + 48 * HOUR))
    manager = Manager(ctx, world)
    manager.run_due()
    assert look(ctx, manager, T0 + 40 * HOUR) == IdlePass()
    assert world.probes == 0  # nothing watched, nothing asked
    assert audited(ctx, lease.id) == []


def test_a_failed_probe_decides_nothing(
    settings: Settings, db: Database, clock: ManualClock
) -> None:
    ctx = build_context(settings, db, clock)
    add_hosts(HostService(ctx), 1)
    lease = LeaseService(ctx).create(ALICE, host_request("unseen", T0, T0 + 48 * HOUR))
    Manager(ctx, StandaloneBackend()).run_due()
    failing = Manager(ctx, FaultyBackend(fault_rate=1.0))
    assert look(ctx, failing, T0 + 10 * HOUR) == IdlePass()
    assert audited(ctx, lease.id) == []
    # The cloud answers again: the lease's idleness was never in doubt.
    assert look(ctx, Manager(ctx, StandaloneBackend()), T0 + 10 * HOUR).warned == (lease.id,)


def test_off_by_default_nothing_is_probed(db: Database, clock: ManualClock, world: World) -> None:
    ctx = build_context(load_settings(env={}), db, clock)
    add_hosts(HostService(ctx), 1)
    lease = LeaseService(ctx).create(ALICE, host_request("unwatched", T0, T0 + 48 * HOUR))
    manager = Manager(ctx, world)
    manager.run_due()
    assert look(ctx, manager, T0 + 40 * HOUR) == IdlePass()
    assert world.probes == 0
    beat = IdleService(ctx).heartbeat(ALICE, lease.id)  # heartbeats are still taken
    assert beat.release_at is None


def test_the_manager_runs_a_pass_every_interval(
    ctx: ServiceContext, manager: Manager, world: World, running: str, clock: ManualClock
) -> None:
    clock.set(T0 + 4 * HOUR)
    wait = manager.idle()
    assert world.probes == 1 and audited(ctx, running) == ["lease.idle.warning"]
    assert 0 < wait <= ctx.settings.idle_interval_seconds
    manager.idle()
    assert world.probes == 1  # not again before the interval


def test_heartbeats_are_refused_as_other_lease_actions_are(
    ctx: ServiceContext, leases: LeaseService, running: str
) -> None:
    idle = IdleService(ctx)
    with pytest.raises(NotFound):
        idle.heartbeat(BOB, running)  # another project's lease is not found
    with pytest.raises(NotFound):
        idle.heartbeat(ALICE, "no-such-lease")
    with pytest.raises(Forbidden):
        idle.heartbeat(READER, running)  # may see it, may not act on it
    later = leases.create(ALICE, host_request("later", T0 + 50 * HOUR, T0 + 52 * HOUR))
    with pytest.raises(Conflict, match="is PENDING: only a running lease is used"):
        idle.heartbeat(ALICE, later.id)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"idle_warning_hours": 6, "idle_release_hours": 6},
            "idle_release_hours: must be longer than idle_warning_hours (6 h), not 6 h",
        ),
        (
            {"idle_warning_hours": 8, "idle_release_hours": 2},
            "idle_release_hours: must be longer than idle_warning_hours (8 h), not 2 h",
        ),
        ({"idle_warning_hours": 0}, "idle_warning_hours: must be above 0"),
        ({"idle_interval_seconds": -1}, "idle_interval_seconds: must be above 0"),
        ({"idle_resource_types": ""}, "idle_resource_types: must not be empty"),
        ({"idle_exempt_projects": "a b"}, "idle_exempt_projects: names without spaces"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        load_settings(env={}, **given)
    assert str(caught.value).startswith(message)


def test_bad_settings_from_the_environment_name_the_variable() -> None:
    env = {"CLIMATE_IDLE_WARNING_HOURS": "12", "CLIMATE_IDLE_RELEASE_HOURS": "10"}
    with pytest.raises(InvalidInput, match="^CLIMATE_IDLE_RELEASE_HOURS: must be longer"):
        load_settings(env=env)
    many = load_settings(env={"CLIMATE_IDLE_EXEMPT_PROJECTS": "ops, infra"})
    assert many.idle_exempt_projects == ("ops", "infra")


def test_an_unknown_resource_type_in_scope_stops_start_up(db: Database, clock: ManualClock) -> None:
    settings = load_settings(env={}, idle_reclaim=True, idle_resource_types="physical:hots")
    with pytest.raises(
        InvalidInput, match="^idle_resource_types: no resource type 'physical:hots'"
    ):
        build_context(settings, db, clock)


# -- over HTTP -----------------------------------------------------------------------------------


@pytest.fixture
def live_lease(settings: Settings, database_url: str) -> Iterator[tuple[str, str]]:
    """A live server (real clock) and a running lease of project-a on it."""
    with serve(settings.model_copy(update={"webhooks": ()}), database_url) as live:
        alice = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
        assert httpx.post(f"{live.url}/v1/os-hosts", json={"name": "c1"}).status_code == 201
        body = {
            "name": "now",
            "start_date": "now",
            "end_date": "2099-01-01 00:00",
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
            "events": [],
        }
        made = httpx.post(f"{live.url}/v1/leases", json=body, headers=alice)
        assert made.status_code == 201, made.text
        lease_id = made.json()["lease"]["id"]
        for _ in range(200):
            shown = httpx.get(f"{live.url}/v1/leases/{lease_id}", headers=alice).json()
            if shown["lease"]["status"] == "ACTIVE":
                break
            time.sleep(0.05)
        yield live.url, lease_id


def test_the_heartbeat_route(live_lease: tuple[str, str]) -> None:
    url, lease_id = live_lease
    path = f"{url}/v1/leases/{lease_id}/heartbeat"
    alice = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
    beat = httpx.post(path, headers=alice)
    assert beat.status_code == 200, beat.text
    shown = beat.json()["heartbeat"]
    assert shown["lease_id"] == lease_id and shown["warning_at"] and shown["release_at"]
    assert httpx.post(path).status_code == 200  # an admin may too
    bob = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
    hidden = httpx.post(path, headers=bob)
    assert hidden.status_code == 404
    assert hidden.json()["error_message"] == (
        f"Lease {lease_id} could not be found (Object with {{'lease_id': '{lease_id}'}} not found)"
    )
    reader = {"X-Project-Id": "project-a", "X-User-Id": "rita", "X-Roles": "reader"}
    refused = httpx.post(path, headers=reader)
    assert refused.status_code == 403
    assert "climate:leases:heartbeat" in refused.json()["error_message"]
    assert httpx.post(f"{url}/v1/leases/no-such-lease/heartbeat").status_code == 404


def test_the_idle_exemption_route(live_lease: tuple[str, str]) -> None:
    url, lease_id = live_lease
    path = f"{url}/v1/leases/{lease_id}/idle"
    alice = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
    refused = httpx.put(path, json={"exempt": True}, headers=alice)
    assert refused.status_code == 403
    assert "climate:leases:idle_exempt" in refused.json()["error_message"]
    bob = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
    assert httpx.put(path, json={"exempt": True}, headers=bob).status_code == 404
    for bad in ({"exempt": "yes"}, {}, {"exempt": True, "why": "x"}):
        assert httpx.put(path, json=bad).status_code == 400, bad
    shown = httpx.put(path, json={"exempt": True})
    assert shown.status_code == 200, shown.text
    assert shown.json()["idle"]["exempt"] is True and shown.json()["idle"]["lease_id"] == lease_id
    beat = httpx.post(f"{url}/v1/leases/{lease_id}/heartbeat", headers=alice).json()
    assert beat["heartbeat"]["release_at"] is None


def test_the_cli_sends_a_heartbeat(
    live_lease: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, lease_id = live_lease
    main(["lease", "heartbeat", "now", "--url", url])
    said = capsys.readouterr().out
    assert said.startswith(f"lease {lease_id}: in use at ")
    assert "if idle, warned at" in said
    main(["lease", "heartbeat", lease_id, "--url", url, "--json"])
    assert f'"lease_id": "{lease_id}"' in capsys.readouterr().out
    main(["lease", "idle-exempt", "now", "--url", url])
    assert capsys.readouterr().out == f"lease {lease_id}: exempt from idle reclamation\n"
    main(["lease", "heartbeat", "now", "--url", url])
    assert capsys.readouterr().out.endswith("; idle reclamation does not watch it\n")
    main(["lease", "idle-exempt", "now", "--off", "--url", url])
    assert capsys.readouterr().out == f"lease {lease_id}: watched by idle reclamation\n"
