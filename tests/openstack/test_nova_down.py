"""Nova's and Placement's APIs stopped mid-lease (their gunicorn on the rig, SIGTERM; started
again exactly as the rig's start.sh starts them): the end event is retried with backoff; a lease
whose attempts run out ends in ERROR with the reason, its host still in its aggregate (never
outside every one); a lease whose retry comes once Nova is back ends TERMINATED with nothing
leaked; an instance start without Placement undoes its flavor and starts on retry."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from climate.backends.base import Timeboxed
from climate.db.tables import Event
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ADMIN
from tests.openstack.conftest import BASE, aggregate, lease_now

MINUTE = dt.timedelta(minutes=1)


def _start_time(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[19]


def _running(pid: int, started: str) -> bool:
    """Alive, not a zombie, and the same process (its start time)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z" and fields[19] == started


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except Exception:
        return False


@contextmanager
def service_stopped(
    env: dict[str, str], name: str, port: str, config: tuple[str, str], app: str
) -> Iterator[None]:
    """The rig's gunicorn service ``name`` stopped (SIGTERM) for the block; then started again as
    start.sh does (``launch``, its config directory in the variable ``config[0]``, BASE/etc/
    ``config[1]``), recorded in BASE/pids so the rig's scripts still know it, and waited for
    until it answers."""
    record = Path(BASE, "pids", f"{name}.pid")
    pid_text, started = record.read_text().split()
    pid = int(pid_text)
    assert _running(pid, started), f"the recorded {name} is not running"
    url = f"http://127.0.0.1:{env[port]}/"
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 40
        while _running(pid, started):
            assert time.monotonic() < deadline, f"{name} did not stop"
            time.sleep(0.1)
        assert not _answers(url)
        yield
    finally:
        venv = Path(env["OSTEST_VENV"])
        gunicorn = [
            str(venv / "bin/gunicorn"),
            "--no-control-socket",
            "--bind", f"127.0.0.1:{env[port]}",
            "--workers", "1",
            "--threads", os.environ.get("WSGI_THREADS", "4"),
            "--timeout", "120",
            app,
        ]  # fmt: skip
        # As start.sh's ``launch``: setsid from a shell, in the background, so that the
        # service is not this process's child (nor reaped or killed with it).
        launched = subprocess.run(
            ["sh", "-c", 'setsid "$@" >> "$OUT" 2>&1 < /dev/null & echo $!', "launch", *gunicorn],
            env={
                **os.environ,
                "PYTHONPATH": str(Path(BASE, "lib")),
                config[0]: str(Path(BASE, "etc", config[1])),
                "OUT": str(Path(BASE, "log", f"{name}.out")),
            },
            capture_output=True,
            text=True,
            check=True,
        )
        new_pid = int(launched.stdout.strip())
        time.sleep(0.05)
        record.write_text(f"{new_pid} {_start_time(new_pid)}\n")
        deadline = time.monotonic() + 120
        while not _answers(url):
            assert time.monotonic() < deadline, f"{name} did not come back"
            time.sleep(0.2)


def nova_api_stopped(env: dict[str, str]) -> AbstractContextManager[None]:
    return service_stopped(
        env, "nova-api", "NOVA_PORT", ("OS_NOVA_CONFIG_DIR", "nova"), "nova_api_app:application"
    )


def placement_stopped(env: dict[str, str]) -> AbstractContextManager[None]:
    return service_stopped(
        env,
        "placement",
        "PLACEMENT_PORT",
        ("OS_PLACEMENT_CONFIG_DIR", "placement"),
        "placement_app:application",
    )


def end_event(ctx: Any, lease_id: str, kind: str = "end_lease") -> Event:
    with ctx.db.reader() as session:
        found = session.scalars(
            select(Event).where(Event.lease_id == lease_id, Event.event_type == kind)
        ).one()
        session.expunge(found)
        return found


def test_nova_down_at_the_end_retries_with_backoff_then_ends_or_errs(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    ctx, backend = climate
    retries = {"event_max_attempts": 3, "event_retry_base_seconds": 10.0}
    ctx = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=retries))
    actor, _ = lessee
    hosts = HostService(ctx, Timeboxed(backend, 60))
    for name in ("compute2", "compute3"):
        hosts.create(ADMIN, name, {})
    leases = LeaseService(ctx)
    gives_up = lease_now(ctx, clock, actor, name="gives-up", length=MINUTE)
    recovers = lease_now(ctx, clock, actor, name="recovers", length=10 * MINUTE)  # clock: now
    manager = Manager(ctx, backend)
    manager.run_due()
    assert [leases.get(actor, x.id).status for x in (gives_up, recovers)] == ["ACTIVE"] * 2
    (lost,) = aggregate(cloud, gives_up.reservations[0].id).hosts
    (kept,) = aggregate(cloud, recovers.reservations[0].id).hosts
    freepool = ctx.settings.freepool_name

    with nova_api_stopped(openstack_env):
        ends = gives_up.end_date
        clock.set(ends)
        for attempt, delay in ((1, 10), (2, 20)):
            manager.run_due()
            event = end_event(ctx, gives_up.id)
            assert (event.status, event.attempts) == ("UNDONE", attempt)
            assert event.not_before == ends + dt.timedelta(seconds=delay)  # 10 s, then 20 s
            assert leases.get(actor, gives_up.id).status == "TERMINATING"
            ends = event.not_before
            clock.set(ends)
        manager.run_due()  # the third and last attempt
        shown = leases.get(actor, gives_up.id)
        assert shown.status == "ERROR"
        assert "end_lease failed after 3 attempt(s)" in (shown.status_reason or "")
        assert end_event(ctx, gives_up.id).last_error

        clock.set(recovers.end_date)
        manager.run_due()
        assert end_event(ctx, recovers.id).status == "UNDONE"
    # Nova is back: the host of the lease in ERROR never left its aggregate.
    assert aggregate(cloud, gives_up.reservations[0].id).hosts == [lost]

    clock.set(end_event(ctx, recovers.id).not_before)
    manager.run_due()
    shown = leases.get(actor, recovers.id)
    assert shown.status == "TERMINATED"
    assert end_event(ctx, recovers.id).status == "DONE"
    assert aggregate(cloud, recovers.reservations[0].id) is None
    assert kept in aggregate(cloud, freepool).hosts


def test_a_hung_nova_request_gives_up_after_the_backend_timeout(
    openstack_env: dict[str, str],
) -> None:
    """A Nova that takes the connection and never answers (a listening socket nobody serves):
    each request of the backend gives up after ``backend_timeout_seconds``, so neither the host
    monitor nor an abandoned event thread hangs forever."""
    from climate.backends.openstack import OpenStackBackend
    from tests.openstack.conftest import rig_settings

    backend = OpenStackBackend.from_settings(
        rig_settings(openstack_env, backend_timeout_seconds=1.0)
    )
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        began = time.monotonic()
        with pytest.raises(Exception, match="(?i)timed? ?out"):
            backend.conn.compute.get(f"http://127.0.0.1:{hung.getsockname()[1]}/os-services")
        assert time.monotonic() - began < 10


def test_placement_down_at_an_instance_start_undoes_it_then_it_starts_once_back(
    climate: Any,
    cloud: Any,
    lessee: tuple[Actor, Any],
    clock: ManualClock,
    openstack_env: dict[str, str],
) -> None:
    """Placement stopped while an instance reservation starts: the start fails, its flavor is
    undone although Placement cannot be, and the event is retried with backoff; with Placement
    back the retry starts the lease in full, and its end leaves nothing behind."""
    ctx, backend = climate
    retries = {"event_max_attempts": 3, "event_retry_base_seconds": 10.0}
    ctx = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=retries))
    actor, _ = lessee
    HostService(ctx, Timeboxed(backend, 60)).create(ADMIN, "compute1", {})
    fields = {"amount": 1, "vcpus": 1, "memory_mb": 256, "disk_gb": 1, "affinity": None}
    lease = lease_now(ctx, clock, actor, "virtual:instance", name="no-placement", **fields)
    rid = lease.reservations[0].id
    manager = Manager(ctx, backend)
    try:
        with placement_stopped(openstack_env):
            manager.run_due()
            event = end_event(ctx, lease.id, "start_lease")
            assert (event.status, event.attempts) == ("UNDONE", 1)
            assert event.not_before == lease.start_date + dt.timedelta(seconds=10)
            assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
            # The aggregate may stay: Nova itself cannot change an aggregate's hosts without
            # Placement (500, PlacementAPIConnectFailure). The retry finds and uses it.
        clock.set(event.not_before)
        manager.run_due()
        assert LeaseService(ctx).get(actor, lease.id).status == "ACTIVE"
        assert end_event(ctx, lease.id, "start_lease").status == "DONE"
        assert cloud.compute.find_flavor(rid, ignore_missing=True) is not None
        assert aggregate(cloud, rid).hosts == ["compute1"]
    finally:
        clock.set(lease.end_date)
        manager.run_due()
    assert cloud.compute.find_flavor(rid, ignore_missing=True) is None
    assert aggregate(cloud, rid) is None
