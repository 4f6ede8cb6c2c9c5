"""The rig's own RabbitMQ stopped and started again while leases start and end: every
notification on the message bus arrives once after it is back, and Nova, which talks over the
same broker, still boots servers.

The rig's broker is private (``RABBIT_PORT`` in its ostest.env, 5673 on machines whose own
RabbitMQ holds 5672, which other tests share and this one never touches). It is stopped with
``rabbitmqctl stop_app`` and started with ``start_app``: the node's listeners close, every
connection (Climate's and Nova's) is cut, transient queues and exchanges are dropped, and all of
it comes back, while the Erlang process that ``start.sh`` recorded stays (killing it would make
the next ``start.sh`` start the rig again from empty databases)."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from bench.openstack import admin_connection

from climate.db import outbox
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.runtime import build_context, build_workers
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request
from tests.openstack.conftest import boot
from tests.test_bus_notifications import Queue

KINDS = (
    "lease.create",
    "lease.event.start_lease",
    "lease.event.before_end_lease",
    "lease.event.end_lease",
)


def _rabbitmqctl(env: dict[str, str], *command: str) -> str:
    node = f"ostest{env['RABBIT_PORT']}@localhost"
    return subprocess.run(
        ["rabbitmqctl", "-q", "-n", node, *command],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    ).stdout


def _consumers(env: dict[str, str]) -> dict[str, int]:
    """Every queue of Nova's on the rig's broker that has consumers, with how many (the queues
    of these tests' own consumers come and go)."""
    out = _rabbitmqctl(env, "list_queues", "--no-table-headers", "name", "consumers")
    counts = {name: int(count) for name, count in (line.split("\t") for line in out.splitlines())}
    return {
        name: count for name, count in counts.items() if count and not name.startswith("climate")
    }


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@contextmanager
def broker_stopped(env: dict[str, str]) -> Iterator[None]:
    """The rig's broker stopped; started again on leaving, whatever happens, and left only once
    Nova is whole again."""
    port = int(env["RABBIT_PORT"])
    before = _consumers(env)
    _rabbitmqctl(env, "stop_app")
    try:
        assert not _listening(port)
        yield
    finally:
        _rabbitmqctl(env, "start_app")
        deadline = time.monotonic() + 60
        while not _listening(port):
            assert time.monotonic() < deadline, "the rig's RabbitMQ did not listen again"
            time.sleep(0.2)
        _nova_back(env, before)


def _reports(cloud: Any) -> dict[str, tuple[str, str]]:
    """Each nova-compute's state and the time of its last status report (ISO 8601, UTC)."""
    return {
        s.host: (s.state, s.updated_at or "")
        for s in cloud.compute.services()
        if s.binary == "nova-compute"
    }


def _nova_back(env: dict[str, str], before: dict[str, int]) -> None:
    """Wait until every queue that had consumers before the stop has them again, and every
    nova-compute has reported its status since the broker came back.

    The restart drops Nova's queues (they are not durable); each service declares its own again
    when oslo.messaging reconnects, with a backoff of its own. Until the scheduler's queue and the
    conductor's reply queue are back, a boot's RPC is dropped unrouted and the server waits out
    the call's 60 s timeout. A nova-compute whose status report was in flight when the broker
    went away waits out that same timeout before it reports again: it still reads up at first,
    then down once its last report is older than ``service_down_time`` (Nova's ComputeFilter then
    refuses it, and a boot ends in ERROR with NoValidHost) until a report gets through. So a
    report newer than the restart is what proves a compute whole. The tests after this one boot
    servers."""
    cloud = admin_connection(env)
    reported = {host: at for host, (_, at) in _reports(cloud).items()}
    deadline = time.monotonic() + 180
    while True:
        now = _consumers(env)
        missing = {name: n for name, n in before.items() if now.get(name, 0) < n}
        states = _reports(cloud)
        stale = {
            host: state
            for host, (state, at) in states.items()
            if state != "up" or at <= reported.get(host, "")
        }
        if not missing and states and not stale:
            return
        assert time.monotonic() < deadline, f"Nova not back: queues {missing}, computes {stale}"
        time.sleep(1)


@pytest.fixture
def sqlite_db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def test_notifications_held_while_the_rigs_broker_is_stopped_arrive_once_after_it_restarts(
    openstack_env: dict[str, str], cloud: Any, settings: Any, sqlite_db: Database
) -> None:
    if not Path(openstack_env["OSTEST_BASE"], "rabbit").is_dir():
        pytest.skip("the rig's RabbitMQ is not its own (no BASE/rabbit)")
    clock = ManualClock(T0)
    topic = f"climate_test_{uuid.uuid4().hex}"
    ctx = build_context(
        settings.model_copy(
            update={
                "notification_transport_url": openstack_env["TRANSPORT_URL"],
                "notification_topics": (topic,),
                "notification_timeout_seconds": 2.0,
            }
        ),
        sqlite_db,
        clock,
    )
    add_hosts(HostService(ctx), 3)
    leases, workers = LeaseService(ctx), build_workers(ctx)
    amqp = f"amqp://guest:guest@127.0.0.1:{openstack_env['RABBIT_PORT']}//"
    try:
        with broker_stopped(openstack_env):
            for index in range(3):
                end = T0 + dt.timedelta(minutes=90 + index)
                leases.create(ALICE, host_request(f"l{index}", T0, end))
            workers.manager.run_due()  # the three leases start
            assert workers.deliverer.deliver_due() >= 1
            clock.set(T0 + dt.timedelta(minutes=95))
            workers.manager.run_due()  # ... warn before their end and end
            with sqlite_db.reader() as session:
                waiting = outbox.by_status(session, outbox.PENDING)
            assert len(waiting) == 12
            assert workers.deliverer.deliver_due() >= 1
            with sqlite_db.reader() as session:
                failed = [m for m in outbox.by_status(session, outbox.PENDING) if m.attempts]
            assert failed and all(m.last_error for m in failed)
        queue = Queue(amqp, topic)  # declared now: the restart dropped transient queues
        try:
            clock.advance(dt.timedelta(hours=1))  # every retry is due
            while workers.deliverer.deliver_due():
                pass
            got = queue.take(12, timeout=30)
        finally:
            queue.close()
    finally:
        workers.deliverer.stop()
    seen = sorted(
        (m["oslo.message"]["payload"]["name"], m["oslo.message"]["event_type"]) for m in got
    )
    assert seen == sorted((f"l{i}", kind) for i in range(3) for kind in KINDS)
    assert len({m["oslo.message"]["message_id"] for m in got}) == 12
    with sqlite_db.reader() as session:
        assert len(outbox.by_status(session, outbox.DELIVERED)) == 12
    # Nova's services reconnected to the broker: a boot goes through API, conductor, scheduler
    # and compute over RPC again.
    flavor = cloud.compute.create_flavor(
        name=f"climate-{uuid.uuid4().hex[:6]}", ram=64, vcpus=1, disk=1
    )
    try:
        server = boot(cloud, openstack_env["OSTEST_IMAGE_ID"], flavor.id)
        cloud.compute.delete_server(server)
        cloud.compute.wait_for_delete(server, wait=60)
    finally:
        cloud.compute.delete_flavor(flavor)
