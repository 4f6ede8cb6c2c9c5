"""Moving from Blazar: a database made by the real Blazar 18 (its API, manager and DB API, run by
``/work/shared/blazar/run_blazar.sh``) imported with ``climate import-blazar``, then shown by
the same ``blazar`` CLI against Climate, and run on by Climate's manager.

The Blazar venv takes about 25 s to install warm; without it these tests skip, except under
CI=true, where they fail.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from climate.backends.base import Backend, Enrol, Inspected, Result, Timeboxed, UnknownResource
from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.manager.service import Manager
from climate.runtime import build_context
from climate.services.blazar_import import BlazarImportService, Unmappable
from tests import real_blazar
from tests.conftest import free_port, serve
from tests.test_blazar_cli import Blazar, cli_env, lease_shown

pytestmark = pytest.mark.slow
FILL = Path(__file__).with_name("blazar") / "fill_blazar.py"
CLIMATE = Path(sys.executable).with_name("climate")
BLAZAR_CLI = Path(sys.executable).with_name("blazar")
A100 = 'resource_properties=["==","$gpu","a100"]'
DATE = "%Y-%m-%d %H:%M"


@dataclass
class Made:
    """A Blazar database and what the blazar CLI showed of it before Blazar stopped."""

    path: Path
    leases: dict[str, dict[str, Any]]
    hosts: dict[str, dict[str, Any]]
    ids: dict[str, str]


@pytest.fixture(scope="module")
def blazar_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    """Hosts and leases (pending, active, ended; host, instance and floating IP reservations)
    made by the real Blazar 18 and its CLI, plus a reservation of an unknown resource type."""
    directory = tmp_path_factory.mktemp("blazar")
    path = directory / "blazar.sqlite"
    port = free_port()
    env = {**os.environ, "FRESH": "1"}
    real_blazar.start(port, path, env)
    try:
        cli = Blazar(cli_env(f"http://127.0.0.1:{port}", OS_AUTH_TYPE="none"))
        cli.json("host-create", "--extra", "gpu=a100", "--extra", "rack=r1", "node-1")
        cli.json("host-create", "--extra", "gpu=h100", "node-2")
        cli.json("host-create", "node-3")
        now = dt.datetime.now(dt.UTC)
        later = (now + dt.timedelta(days=1)).strftime(DATE)
        after = (now + dt.timedelta(days=2)).strftime(DATE)
        soon_over = (now + dt.timedelta(hours=3)).strftime(DATE)
        h100 = 'min=1,max=1,resource_properties=["==","$gpu","h100"]'
        ids = {
            "pending": cli.json(
                "lease-create", "--physical-reservation", h100,
                "--start-date", later, "--end-date", after, "pending-lease",
            )["id"],
            "active": cli.json(
                "lease-create", "--physical-reservation", f"min=1,max=1,{A100}",
                "--start-date", "now", "--end-date", soon_over, "active-lease",
            )["id"],
            "instances": cli.json(
                "lease-create", "--reservation",
                "resource_type=virtual:instance,vcpus=2,memory_mb=1024,disk_gb=10,amount=2,"
                "affinity=False",
                "--start-date", later, "--end-date", after, "instance-lease",
            )["id"],
        }  # fmt: skip
        lease_shown_active = _wait_active(cli, ids["active"])
        assert lease_shown_active["status"] == "ACTIVE"
    finally:
        real_blazar.stop(port, env)
    python = real_blazar.state() / "venv" / "bin" / "python"
    filled = subprocess.run(
        [str(python), "-W", "ignore", str(FILL), str(path), "--unmappable"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ids.update(json.loads(filled.stdout.strip().splitlines()[-1]))
    # What the blazar CLI shows of it: Blazar again on the finished database (no FRESH).
    env["FRESH"] = "0"
    real_blazar.start(port, path, env)
    try:
        listed = cli.json("lease-list")
        leases = {lease["id"]: lease_shown(cli, lease["id"]) for lease in listed}
        names = [h["hypervisor_hostname"] for h in cli.json("host-list")]
        hosts = {name: cli.json("host-show", name) for name in names}
    finally:
        real_blazar.stop(port, env)
    yield Made(path, leases, hosts, ids)


def _wait_active(cli: Blazar, lease_id: str) -> dict[str, Any]:
    """Blazar's manager starts a lease at its 10-second poll."""
    deadline = time.monotonic() + 30
    while True:
        shown = lease_shown(cli, lease_id)
        if shown["status"] == "ACTIVE" or time.monotonic() > deadline:
            return shown
        time.sleep(0.5)


def _copy(made: Made, directory: Path) -> str:
    target = directory / "blazar-copy.sqlite"
    shutil.copy(made.path, target)
    return f"sqlite:///{target}"


def _import(blazar_url: str, climate_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLIMATE), "import-blazar", "--database-url", blazar_url, "--into", climate_url,
         *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


BLAZAR_ONLY = {"aggregate_id"}
"""Shown by Blazar, differently by Climate: an instance reservation's aggregate is named by the
reservation id in Climate (Blazar shows Nova's number for it)."""


STAMPS = ("created_at", "updated_at")
"""Climate shows these to the second (Blazar with microseconds): compared to the second."""


def differences(blazar: dict[str, Any], climate: dict[str, Any], where: str) -> list[str]:
    """Every field Blazar shows that Climate shows otherwise (reservations and events by id)."""
    found = []
    for key, value in blazar.items():
        if key in BLAZAR_ONLY:
            continue
        if key in ("reservations", "events"):
            theirs = {r["id"]: r for r in climate[key]}
            if set(theirs) != {item["id"] for item in value}:
                found.append(f"{where}.{key}: Blazar {value!r}, Climate {climate[key]!r}")
                continue
            for item in value:
                found += differences(item, theirs[item["id"]], f"{where}.{key}[{item['id']}]")
            continue
        expected = value.split(".")[0] if key in STAMPS and isinstance(value, str) else value
        if climate.get(key) != expected:
            found.append(f"{where}.{key}: Blazar {value!r}, Climate {climate.get(key)!r}")
    return found


def test_a_real_blazar_database_round_trips_through_the_blazar_cli(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    source = _copy(blazar_db, tmp_path)
    with serve(settings, sqlite_url) as server:
        cli = Blazar(cli_env(server.url, OS_AUTH_TYPE="none"))
        # A lease refused before the import loads this server's calendar, so that it must
        # catch up with the imported allocations rather than read them fresh.
        cli.fails("lease-create", "--physical-reservation", f"min=1,max=1,{A100}",
                  "--start-date", "now", "--end-date", _in(hours=1), "early")  # fmt: skip

        dry = _report(_import(source, sqlite_url, "--dry-run", "--json"))
        assert dry["unmappable"] == [
            f"reservation {blazar_db.ids['odd_reservation']}: resource type 'foo' unknown",
            f"lease {blazar_db.ids['odd']} (odd-lease): left out with its reservations",
        ]
        assert dry["written"]["leases"] == len(blazar_db.leases) - 1
        assert cli.json("lease-list") == []

        refused = _import(source, sqlite_url)
        assert refused.returncode != 0
        assert "resource type 'foo' unknown" in refused.stderr
        assert cli.json("lease-list") == [] and cli.json("host-list") == []

        first = _report(_import(source, sqlite_url, "--skip-unmappable", "--json"))
        assert first["written"] == dry["written"]
        again = _report(_import(source, sqlite_url, "--skip-unmappable", "--json"))
        assert again["written"] == {}
        assert again["already"]["leases"] == len(blazar_db.leases) - 1

        shown = {lease["id"] for lease in cli.json("lease-list")}
        assert shown == set(blazar_db.leases) - {blazar_db.ids["odd"]}
        found = []
        for lease_id in shown:
            found += differences(blazar_db.leases[lease_id], lease_shown(cli, lease_id), lease_id)
        climate_hosts = {h["hypervisor_hostname"]: h for h in cli.json("host-list")}
        assert set(climate_hosts) == set(blazar_db.hosts)
        for name, theirs in blazar_db.hosts.items():
            ours = cli.json("host-show", climate_hosts[name]["id"])
            found += differences({k: v for k, v in theirs.items() if k != "id"}, ours, name)
        assert found == []

        # node-1, the only a100 host, is the active lease's until its end: no double booking.
        overlap = ("--start-date", "now", "--end-date", _in(hours=1), "overlap")
        refusal = cli.fails(
            "lease-create", "--physical-reservation", f"min=1,max=1,{A100}", *overlap
        )
        assert "Not enough" in refusal or "not enough" in refusal, refusal

    _run_to_end(settings, sqlite_url, blazar_db.ids["active"])


def _in(**delta: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(**delta)).strftime(DATE)


def _run_to_end(settings: Settings, url: str, lease_id: str) -> None:
    """Climate's manager (standalone backend) ends the imported active lease at its end."""
    database = Database(url)
    try:
        clock = ManualClock(dt.datetime.now(dt.UTC))
        ctx = build_context(settings, database, clock)
        lease = _lease(ctx.db, lease_id)
        assert lease["status"] == "ACTIVE"
        clock.set(dt.datetime.fromisoformat(lease["end_date"]) + dt.timedelta(seconds=1))
        Manager(ctx, StandaloneBackend()).run_due()
        ended = _lease(ctx.db, lease_id)
        assert ended["status"] == "TERMINATED"
    finally:
        database.dispose()


def _lease(db: Database, lease_id: str) -> dict[str, Any]:
    from climate import wire
    from climate.db import leases as lease_rows

    with db.reader() as session:
        row = lease_rows.get(session, lease_id)
        assert row is not None
        body = wire.lease(row)
        body["end_date"] = row.end_date.isoformat()
        return body


class KnownHosts(Backend):
    """Nova as the import asks it: it knows only these hosts (no Nova runs here)."""

    name = "known-hosts"

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def handle(self, actions: Any) -> list[Result]:
        return [
            Inspected()
            if not isinstance(a, Enrol) or a.name in self.names
            else UnknownResource(f"no hypervisor named {a.name!r}")
            for a in actions
        ]


def test_a_host_nova_no_longer_knows_is_named_and_left_out_only_when_asked(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    source = _copy(blazar_db, tmp_path)
    database = Database(sqlite_url)
    try:
        ctx = build_context(settings, database)
        nova = Timeboxed(KnownHosts({"node-2", "node-3"}), 5)
        service = BlazarImportService(ctx, nova)
        dry = service.run(source, dry_run=True)
        assert "host 'node-1': the cloud no longer knows it (no hypervisor named 'node-1')" in (
            dry.unmappable
        )
        active = blazar_db.ids["active"]
        assert any(f"of lease {active} (active-lease): holds host 'node-1'" in u
                   for u in dry.unmappable)  # fmt: skip
        with pytest.raises(Unmappable, match="node-1"):
            service.run(source, dry_run=False)
        with database.reader() as session:
            from climate.db.tables import Host, Lease

            assert session.query(Lease).count() == 0 and session.query(Host).count() == 0

        done = service.run(source, dry_run=False, skip_unmappable=True)
        assert done.skipped
        lease = _lease(database, active)
        assert lease["degraded"] is True
        (reservation,) = lease["reservations"]
        assert reservation["missing_resources"] is True and reservation["allocations"] == []
    finally:
        database.dispose()


def test_a_lease_whose_name_a_live_climate_lease_of_its_project_holds_is_named_and_left_out(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    from climate.db.tables import Lease

    source = _copy(blazar_db, tmp_path)
    database = Database(sqlite_url)
    active = blazar_db.leases[blazar_db.ids["active"]]
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    try:
        with database.transaction() as session:
            session.add(
                Lease(
                    name="active-lease",
                    project_id=active["project_id"],
                    user_id="u",
                    start_date=at,
                    end_date=at + dt.timedelta(hours=1),
                    status="PENDING",
                    created_at=at,
                )
            )
        service = BlazarImportService(build_context(settings, database))
        report = service.run(source, dry_run=True)
        assert (
            f"lease {blazar_db.ids['active']} (active-lease): project {active['project_id']} has "
            "a live lease of that name"
        ) in report.unmappable
    finally:
        database.dispose()


def test_an_event_without_a_time_is_named_and_its_lease_left_out(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    """``events.time`` is nullable in Blazar's schema: such a row is reported, not a crash."""
    source = _copy(blazar_db, tmp_path)
    pending = blazar_db.ids["pending"]
    with sqlite3.connect(source.removeprefix("sqlite:///")) as blazar:
        (event_id,) = blazar.execute(
            "SELECT id FROM events WHERE lease_id = ? AND event_type = 'end_lease'", (pending,)
        ).fetchone()
        blazar.execute("UPDATE events SET time = NULL WHERE id = ?", (event_id,))
    database = Database(sqlite_url)
    try:
        service = BlazarImportService(build_context(settings, database))
        report = service.run(source, dry_run=True)
        named = f"event {event_id} (end_lease) of lease {pending} (pending-lease): it has no time"
        assert named in report.unmappable
        done = service.run(source, dry_run=False, skip_unmappable=True)
        assert done.written["leases"] == len(blazar_db.leases) - 2  # and the odd lease
    finally:
        database.dispose()


def test_two_blazar_hosts_of_one_name_are_named_not_a_crash(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    """Blazar's ``computehosts.hypervisor_hostname`` is not unique; Climate's host names are."""
    source = _copy(blazar_db, tmp_path)
    with sqlite3.connect(source.removeprefix("sqlite:///")) as blazar:
        blazar.execute(
            "UPDATE computehosts SET hypervisor_hostname = 'node-1' "
            "WHERE hypervisor_hostname = 'node-3'"
        )
        # The import reads them in id order: the later one is refused.
        ((first,), (second,)) = blazar.execute(
            "SELECT id FROM computehosts WHERE hypervisor_hostname = 'node-1' ORDER BY id"
        ).fetchall()
    database = Database(sqlite_url)
    try:
        service = BlazarImportService(build_context(settings, database))
        report = service.run(source, dry_run=True)
        assert f"host {second}: 'node-1' is also Blazar host {first}'s name" in report.unmappable
        done = service.run(source, dry_run=False, skip_unmappable=True)
        assert done.written["hosts"] == len(blazar_db.hosts) - 1
    finally:
        database.dispose()


def test_dates_that_are_not_dates_are_named_not_a_traceback(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    """An SQLite file edited by hand: a lease's start and an event's time that are not dates
    leave their leases out, named; a host's ``created_at`` that is not one is only noted."""
    source = _copy(blazar_db, tmp_path)
    pending, active = blazar_db.ids["pending"], blazar_db.ids["active"]
    with sqlite3.connect(source.removeprefix("sqlite:///")) as blazar:
        blazar.execute("UPDATE leases SET start_date = 'next tuesday' WHERE id = ?", (pending,))
        (event_id,) = blazar.execute(
            "SELECT id FROM events WHERE lease_id = ? AND event_type = 'end_lease'", (active,)
        ).fetchone()
        blazar.execute("UPDATE events SET time = 'soon' WHERE id = ?", (event_id,))
        blazar.execute(
            "UPDATE computehosts SET created_at = 'yesterday' WHERE hypervisor_hostname = 'node-3'"
        )
    dry = _report(_import(source, sqlite_url, "--dry-run", "--json"))
    odd_event = f"event {event_id} (end_lease) of lease {active} (active-lease)"
    assert f"{odd_event}: time 'soon' is not a date" in dry["unmappable"]
    odd_lease = f"lease {pending} (pending-lease)"
    assert f"{odd_lease}: start_date 'next tuesday' is not a date" in dry["unmappable"]
    assert (
        "host 'node-3': created_at 'yesterday' is not a date; taken as the import's time"
    ) in dry["notes"]

    refused = _import(source, sqlite_url)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "\nerror: the Blazar database has rows Climate cannot map" in refused.stderr
    assert "start_date 'next tuesday' is not a date" in refused.stderr

    done = _report(_import(source, sqlite_url, "--skip-unmappable", "--json"))
    assert done["written"]["leases"] == len(blazar_db.leases) - 3  # and the odd lease
    assert done["written"]["hosts"] == len(blazar_db.hosts)


def test_a_lease_without_a_project_or_a_user_is_named_and_left_out(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    """Both columns are nullable in Blazar's schema; a Climate lease belongs to a user of a
    project: no lease is imported as the project (or user) ``""``."""
    source = _copy(blazar_db, tmp_path)
    pending, instances = blazar_db.ids["pending"], blazar_db.ids["instances"]
    with sqlite3.connect(source.removeprefix("sqlite:///")) as blazar:
        blazar.execute("UPDATE leases SET project_id = NULL WHERE id = ?", (pending,))
        blazar.execute("UPDATE leases SET user_id = NULL WHERE id = ?", (instances,))
    database = Database(sqlite_url)
    try:
        service = BlazarImportService(build_context(settings, database))
        report = service.run(source, dry_run=True)
        assert f"lease {pending} (pending-lease): it has no project_id" in report.unmappable
        assert f"lease {instances} (instance-lease): it has no user_id" in report.unmappable
        done = service.run(source, dry_run=False, skip_unmappable=True)
        assert done.written["leases"] == len(blazar_db.leases) - 3  # and the odd lease
        with database.reader() as session:
            from climate.db.tables import Lease

            owners = session.query(Lease.project_id, Lease.user_id).all()
        assert owners and all(project and user for project, user in owners)
    finally:
        database.dispose()


def test_a_lease_that_ends_at_its_start_is_named_and_left_out(
    blazar_db: Made, settings: Settings, sqlite_url: str, tmp_path: Path
) -> None:
    """Blazar's API refuses such a lease, as Climate's does: one made by hand is not imported
    without a word."""
    source = _copy(blazar_db, tmp_path)
    pending = blazar_db.ids["pending"]
    with sqlite3.connect(source.removeprefix("sqlite:///")) as blazar:
        blazar.execute("UPDATE leases SET end_date = start_date WHERE id = ?", (pending,))
        (start,) = blazar.execute(
            "SELECT start_date FROM leases WHERE id = ?", (pending,)
        ).fetchone()
    at = start.partition(".")[0]
    database = Database(sqlite_url)
    try:
        service = BlazarImportService(build_context(settings, database))
        report = service.run(source, dry_run=True)
        assert (
            f"lease {pending} (pending-lease): end_date {at} is not after start_date {at}"
        ) in report.unmappable
        done = service.run(source, dry_run=False, skip_unmappable=True)
        assert done.written["leases"] == len(blazar_db.leases) - 2  # and the odd lease
    finally:
        database.dispose()
