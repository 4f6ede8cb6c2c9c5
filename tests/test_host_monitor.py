"""The manager's host monitor (manager/monitor.py) with a backend that reports host states: a
host the world reports down is marked down (and healed), back up is marked up; a host an
operator marked down stays down; a host the world does not know is left alone; a failed look
is tried again next period."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from climate.backends.base import HostState, Timeboxed
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.manager.monitor import HostMonitor
from climate.services.context import ServiceContext
from climate.services.healing import HealingService
from climate.services.hosts import HostService
from tests.conftest import ADMIN
from tests.helpers import add_hosts


class Watching(StandaloneBackend):
    watches_hosts = True

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, HostState] = {}
        self.looked = threading.Semaphore(0)
        self.fail = False

    def host_states(self) -> Mapping[str, HostState]:
        self.looked.release()
        if self.fail:
            raise ConnectionError("nova unreachable")
        return dict(self.states)


def health(hosts: HostService, host_id: int) -> tuple[str, str | None]:
    host = hosts.get(ADMIN, str(host_id))
    return host.health, host.health_reason


def test_the_world_s_down_and_up_are_followed(ctx: ServiceContext, hosts: HostService) -> None:
    first, second = add_hosts(hosts, 2)
    backend = Watching()
    monitor = HostMonitor(ctx, Timeboxed(backend, 10))
    backend.states = {
        "compute-0": HostState(False, "nova: forced down"),
        "compute-9": HostState(False),
    }
    (report,) = monitor.poll()
    assert report.host.id == first
    assert health(hosts, first) == ("down", "nova: forced down")
    assert health(hosts, second) == ("up", None)  # not reported at all: left alone
    assert monitor.poll() == []  # still down: nothing new
    backend.states = {"compute-0": HostState(True), "compute-1": HostState(True)}
    (report,) = monitor.poll()
    assert health(hosts, first) == ("up", None)


def test_an_operator_s_down_is_not_undone(ctx: ServiceContext, hosts: HostService) -> None:
    (host,) = add_hosts(hosts, 1)
    backend = Watching()
    HealingService(ctx, Timeboxed(backend, 10)).mark_down(ADMIN, str(host), "disk swap")
    backend.states = {"compute-0": HostState(True)}
    assert HostMonitor(ctx, Timeboxed(backend, 10)).poll() == []
    assert health(hosts, host) == ("down", "disk swap")


def test_a_failed_look_is_tried_again(
    settings: Settings, ctx: ServiceContext, hosts: HostService
) -> None:
    (host,) = add_hosts(hosts, 1)
    backend = Watching()
    backend.fail = True
    fast = ServiceContext(
        settings.model_copy(update={"nova_poll_seconds": 0.05}),
        ctx.db,
        ctx.clock,
        ctx.resource_types,
    )
    monitor = HostMonitor(fast, Timeboxed(backend, 10))
    monitor.start()
    try:
        assert backend.looked.acquire(timeout=5)
        backend.states = {"compute-0": HostState(False, "nova: down")}
        backend.fail = False
        for _ in range(3):
            assert backend.looked.acquire(timeout=5)
        assert health(hosts, host) == ("down", "nova: down")
    finally:
        monitor.stop()
