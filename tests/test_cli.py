"""The ``climate`` command line, run as a real subprocess against a live server or a database."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from climate.config import Settings
from climate.db.engine import Database
from climate.domain.clock import SystemClock
from climate.runtime import build_context
from tests.conftest import LiveServer

CLIMATE = str(Path(sys.executable).with_name("climate"))


def _env() -> dict[str, str]:
    """The caller's environment without settings, credentials or proxies that would change what
    runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLIMATE_", "OS_"))}
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        env.pop(key, None)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def run(
    *args: str, ok: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``climate ARGS`` in a clean environment (with ``env`` added)."""
    done = subprocess.run(
        [CLIMATE, *args],
        capture_output=True,
        text=True,
        env={**_env(), **(env or {})},
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    else:
        assert done.returncode != 0, (args, done.stdout, done.stderr)
    return done


def run_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(run(*args, "--json", env=env).stdout)


def fmt(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")


def test_host_commands(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    host = run_json(
        "host", "create", "compute-0", "--extra", "gpu=a100", "--extra", "vcpus=8", *url
    )
    assert (host["hypervisor_hostname"], host["gpu"], host["vcpus"]) == ("compute-0", "a100", 8)
    host_id = host["id"]

    listed = run_json("host", "list", *url)
    assert [(h["id"], h["hypervisor_hostname"]) for h in listed] == [(host_id, "compute-0")]
    table = run("host", "list", *url).stdout
    assert "hypervisor_hostname" in table and "compute-0" in table

    assert run_json("host", "show", host_id, *url) == host
    assert "| gpu " in run("host", "show", host_id, *url).stdout

    updated = run_json("host", "update", host_id, "--extra", "vcpus=16", "--extra", "rack=r1", *url)
    assert (updated["vcpus"], updated["rack"], updated["gpu"]) == (16, "r1", "a100")

    # Errors exit non-zero with the server's message, not a traceback.
    duplicate = run("host", "create", "compute-0", *url, ok=False)
    assert "error (409)" in duplicate.stderr and "compute-0" in duplicate.stderr
    missing = run("host", "show", "999", *url, ok=False)
    assert "no host with the id or name '999'" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = run("host", "update", host_id, "--extra", "novalue", *url, ok=False)
    assert "key=value" in bad.stderr
    member = run("host", "list", *url, "--project", "project-a", ok=False)
    assert "error (403)" in member.stderr

    assert run("host", "delete", host_id, *url).stdout.strip() == f"Deleted host {host_id}"
    assert run_json("host", "list", *url) == []


def test_lease_commands(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    for name, gpu in (("compute-0", "a100"), ("compute-1", "v100")):
        run("host", "create", name, "--extra", f"gpu={gpu}", *url)
    t0 = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    start, end = t0 + dt.timedelta(days=1), t0 + dt.timedelta(days=2)
    lease = run_json(
        "lease",
        "create",
        "cli-lease",
        "--start",
        fmt(start),
        "--end",
        end.isoformat(),
        "--properties",
        '["==", "$gpu", "a100"]',
        *url,
        "--project",
        "project-a",
    )
    assert (lease["name"], lease["status"], lease["project_id"]) == (
        "cli-lease",
        "PENDING",
        "project-a",
    )
    assert lease["start_date"] == start.strftime("%Y-%m-%dT%H:%M:%S.%f")
    assert lease["reservations"][0]["resource_properties"] == '["==", "$gpu", "a100"]'
    lease_id = lease["id"]

    as_a = (*url, "--project", "project-a")
    assert [item["id"] for item in run_json("lease", "list", *as_a)] == [lease_id]
    assert run_json("lease", "list", *url, "--project", "project-b") == []
    assert [item["id"] for item in run_json("lease", "list", *url)] == [lease_id]  # admin
    assert "cli-lease" in run("lease", "list", *as_a).stdout
    assert run_json("lease", "show", lease_id, *as_a)["id"] == lease_id

    new_end = end + dt.timedelta(hours=6)
    updated = run_json(
        "lease", "update", lease_id, "--name", "renamed", "--end", fmt(new_end), *as_a
    )
    assert updated["name"] == "renamed"
    assert updated["end_date"] == new_end.strftime("%Y-%m-%dT%H:%M:%S.%f")

    # Another project's lease is not found; a bad request shows the field.
    other = run("lease", "show", lease_id, *url, "--project", "project-b", ok=False)
    assert "error (404)" in other.stderr
    refused = run("lease", "create", "x", "--end", "not-a-date", *as_a, ok=False)
    assert "error (400)" in refused.stderr and "end_date" in refused.stderr
    too_many = run("lease", "create", "y", "--end", fmt(end), "--min", "3", *as_a, ok=False)
    assert "error (409)" in too_many.stderr

    assert run("lease", "delete", lease_id, *as_a).stdout.strip() == f"Deleted lease {lease_id}"
    assert run_json("lease", "list", *as_a) == []


def test_client_reports_an_unreachable_server() -> None:
    done = run("lease", "list", "--url", "http://127.0.0.1:9", ok=False)
    assert "cannot reach" in done.stderr and "Traceback" not in done.stderr


def test_an_update_that_changes_nothing_is_refused_before_it_is_sent() -> None:
    # The server is unreachable: the refusal is the command's own, before any request.
    done = run("lease", "update", "some-lease", "--url", "http://127.0.0.1:9", ok=False)
    assert done.returncode == 1 and "cannot reach" not in done.stderr, done.stderr
    assert "error: nothing to update; give --name, --start, --end, --min, --max" in done.stderr


def test_a_host_update_that_changes_nothing_is_refused_before_it_is_sent() -> None:
    done = run("host", "update", "h-1", "--url", "http://127.0.0.1:9", ok=False)
    assert done.returncode == 1 and "cannot reach" not in done.stderr, done.stderr
    assert "error: nothing to update; give --extra KEY=VALUE" in done.stderr


def test_an_update_refused_prints_the_changes_offered(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "compute-0", *url)
    t0 = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(days=1)
    hour = dt.timedelta(hours=1)
    first = run_json("lease", "create", "first", "--start", fmt(t0), "--end", fmt(t0 + hour), *url)
    run_json(
        "lease", "create", "next", "--start", fmt(t0 + 2 * hour), "--end", fmt(t0 + 3 * hour), *url
    )
    refused = run("lease", "update", first["id"], "--end", fmt(t0 + 4 * hour), *url, ok=False)
    assert "error (409)" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    offered = [line.strip() for line in refused.stderr.splitlines() if line.startswith("  ")]
    assert offered and all("--end" in line for line in offered), refused.stderr
    assert not any("--min" in line for line in offered)  # an update's offer changes dates only


def test_a_reader_that_stops_early_ends_the_output_quietly(live_sqlite: LiveServer) -> None:
    with httpx.Client(base_url=live_sqlite.url) as api:
        for i in range(3):
            assert api.post("/v1/os-hosts", json={"name": f"compute-{i}"}).is_success
    # ``true`` reads nothing and is gone long before the command has its answer to write.
    shell = f"{CLIMATE} host list -f json --url {live_sqlite.url} | true"
    done = subprocess.run(
        ["bash", "-c", f"{shell}; exit ${{PIPESTATUS[0]}}"],
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)


def test_an_address_that_is_not_climate_is_named_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "os-hosts").write_text("<html><body>a web server</body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"http://127.0.0.1:{server.server_address[1]}"
        done = run("host", "list", "--url", address, ok=False)
        server.shutdown()
    assert "Traceback" not in done.stderr, done.stderr
    assert "no JSON (is it Climate?)" in done.stderr and "a web server" in done.stderr


def test_db_upgrade_and_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'climate.db'}"
    fresh = run("db", "current", "--database-url", url).stdout
    assert re.search(r"schema at None \(head \w+\)", fresh), fresh
    upgraded = run("db", "upgrade", "--database-url", url).stdout
    match = re.search(r"schema at (\w+) \(head (\w+)\)", upgraded)
    assert match is not None and match.group(1) == match.group(2), upgraded
    assert run("db", "upgrade", "--database-url", url).stdout == upgraded  # idempotent


@contextlib.contextmanager
def token_server(settings: Settings, url: str) -> Iterator[LiveServer]:
    database = Database(url)
    try:
        context = build_context(
            settings.model_copy(update={"auth": "token"}), database, SystemClock()
        )
        with LiveServer(context) as server:
            yield server
    finally:
        database.dispose()


def test_token_commands(settings: Settings, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'climate.db'}"  # token commands migrate a SQLite file
    db = ("--database-url", db_url)
    # --database-url is accepted before or after the action.
    admin = run(
        "token", "create", "ops", "--user", "carol", "--project", "ops", "--roles", "admin",
        "--no-expiry", *db
    ).stdout.strip()  # fmt: skip
    member = run(
        "token", *db, "create", "alice", "--user", "alice", "--project", "project-a", "--days", "2"
    ).stdout.strip()
    assert admin.startswith("clm_") and member.startswith("clm_") and admin != member

    listed = run_json("token", "list", *db)
    by_name = {row["name"]: row for row in listed}
    assert set(by_name) == {"ops", "alice"}
    assert (by_name["ops"]["user"], by_name["ops"]["project"], by_name["ops"]["roles"]) == (
        "carol",
        "ops",
        "admin",
    )
    assert by_name["ops"]["expires_at"] is None and by_name["alice"]["expires_at"] is not None
    assert all(row["revoked_at"] is None for row in listed)
    assert admin not in json.dumps(listed) and admin.split("_", 2)[2] not in json.dumps(listed)

    with token_server(settings, db_url) as server:
        url = ("--url", server.url)
        anonymous = run("host", "list", *url, ok=False)
        assert "error (401)" in anonymous.stderr
        assert run_json("host", "list", *url, "--token", admin) == []
        assert run_json("lease", "list", *url, "--token", member) == []
        forbidden = run("host", "create", "h", *url, "--token", member, ok=False)
        assert "error (403)" in forbidden.stderr

        member_id = by_name["alice"]["id"]
        revoked = run("token", "revoke", member_id, *db).stdout.strip()
        assert revoked == f"Revoked token {member_id}"
        after = run("lease", "list", *url, "--token", member, ok=False)
        assert "error (401)" in after.stderr
        assert run_json("host", "list", *url, "--token", admin) == []

    rows = {row["name"]: row for row in run_json("token", "list", *db)}
    assert rows["alice"]["revoked_at"] is not None and rows["ops"]["revoked_at"] is None
    unknown = run("token", "revoke", "no-such-token", *db, ok=False)
    assert "no-such-token" in unknown.stderr and "Traceback" not in unknown.stderr


def test_a_token_expires_unless_never_is_asked_for_explicitly(tmp_path: Path) -> None:
    db = ("--database-url", f"sqlite:///{tmp_path / 'climate.db'}")
    create = ("token", "create", "--user", "u", "--project", "p", *db)
    for days in ("0", "-1", "1.5", "soon"):
        refused = run(*create, f"t{days}", f"--days={days}", ok=False)
        assert f"argument --days: must be a whole number of days above 0, not '{days}'" in (
            refused.stderr
        )
    both = run(*create, "both", "--days", "3", "--no-expiry", ok=False)
    assert "not allowed with argument" in both.stderr
    run(*create, "default")
    run(*create, "week", "--days", "7")
    run(*create, "forever", "--no-expiry")
    listed = {row["name"]: row["expires_at"] for row in run_json("token", "list", *db)}
    assert set(listed) == {"default", "week", "forever"}
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    days_left = {
        name: round((dt.datetime.fromisoformat(stamp) - now) / dt.timedelta(days=1))
        for name, stamp in listed.items()
        if stamp is not None
    }
    assert days_left == {"default": 90, "week": 7} and listed["forever"] is None


@pytest.mark.parametrize("args", [["lease"], ["host", "frobnicate"], ["token"], []])
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = run(*args, ok=False)
    assert done.returncode == 2 and "usage:" in done.stderr
