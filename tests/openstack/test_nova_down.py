"""The Nova API stopped mid-lease (its gunicorn on the rig, SIGTERM; started again exactly as the
rig's start.sh starts it): the end event is retried with backoff; a lease whose attempts run out
ends in ERROR with the reason, its host still in its aggregate (never outside every one); a
lease whose retry comes once Nova is back ends TERMINATED with nothing leaked."""

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
from contextlib import contextmanager
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
def nova_api_stopped(env: dict[str, str]) -> Iterator[None]:
    """The rig's nova-api stopped (SIGTERM) for the block; then started again as start.sh does
    (``launch nova-api``), recorded in BASE/pids so the rig's scripts still know it, and waited
    for until it answers."""
    record = Path(BASE, "pids", "nova-api.pid")
    pid_text, started = record.read_text().split()
    pid = int(pid_text)
    assert _running(pid, started), "the recorded nova-api is not running"
    url = env["NOVA_URL"].rsplit("/v2.1", 1)[0] + "/"
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 40
        while _running(pid, started):
            assert time.monotonic() < deadline, "nova-api did not stop"
            time.sleep(0.1)
        assert not _answers(url)
        yield
    finally:
        venv = Path(env["OSTEST_VENV"])
        gunicorn = [
            str(venv / "bin/gunicorn"),
            "--no-control-socket",
            "--bind", f"127.0.0.1:{env['NOVA_PORT']}",
            "--workers", "1",
            "--threads", os.environ.get("WSGI_THREADS", "4"),
            "--timeout", "120",
            "nova_api_app:application",
        ]  # fmt: skip
        # As start.sh's ``launch``: setsid from a shell, in the background, so that the
        # service is not this process's child (nor reaped or killed with it).
        launched = subprocess.run(
            ["sh", "-c", 'setsid "$@" >> "$OUT" 2>&1 < /dev/null & echo $!', "launch", *gunicorn],
            env={
                **os.environ,
                "PYTHONPATH": str(Path(BASE, "lib")),
                "OS_NOVA_CONFIG_DIR": str(Path(BASE, "etc", "nova")),
                "OUT": str(Path(BASE, "log", "nova-api.out")),
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
            assert time.monotonic() < deadline, "nova-api did not come back"
            time.sleep(0.2)


def end_event(ctx: Any, lease_id: str) -> Event:
    with ctx.db.reader() as session:
        found = session.scalars(
            select(Event).where(Event.lease_id == lease_id, Event.event_type == "end_lease")
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
