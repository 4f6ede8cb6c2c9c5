"""The ``climate`` command line as people use it, run as a real subprocess against a live server:
the calendar, ``lease create --wait``, names for ids, ``-f json|yaml|table``, where the client
finds the server and its token, and ``--help`` everywhere."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from climate.cli.main import _parser
from climate.config import Settings
from tests.conftest import LiveServer, serve
from tests.test_cli import fmt, run, run_json, token_server

DAY0 = (dt.datetime.now(dt.UTC) + dt.timedelta(days=10)).replace(
    hour=0, minute=0, second=0, microsecond=0
)
UNREACHABLE = "http://127.0.0.1:9"


def day(n: float) -> str:
    return fmt(DAY0 + dt.timedelta(days=n))


def seed(url: tuple[str, ...]) -> dict[str, Any]:
    """Two hosts (racks 1 and 2) and a lease on each: alpha days 1-3, beta day 2.5-4."""
    run("host", "create", "h-a", "--extra", "rack=1", *url)
    run("host", "create", "h-b", "--extra", "rack=2", *url)
    alpha = run_json(
        "lease", "create", "alpha", "--start", day(1), "--end", day(3),
        "--properties", '["==", "$rack", "1"]', *url,
    )  # fmt: skip
    beta = run_json(
        "lease", "create", "beta", "--start", day(2.5), "--end", day(4),
        "--properties", '["==", "$rack", "2"]', *url,
    )  # fmt: skip
    return {"alpha": alpha, "beta": beta}


def _utc(wire: str) -> dt.datetime:
    return dt.datetime.fromisoformat(wire).replace(tzinfo=dt.UTC)


def grid(shown: str, resource: str) -> str:
    """The chart's cells of one row (between the label column and the right border)."""
    lines = shown.splitlines()
    header = next(line for line in lines if line.startswith("| resource "))
    begin = header.index(" | ") + 3
    (row,) = [line for line in lines if line.startswith(f"| {resource} ")]
    return row[begin:-2]


def test_calendar_puts_each_lease_in_its_columns(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    leases = seed(url)
    window = ("--start", DAY0.strftime("%Y-%m-%d"), "--days", "7")
    shown = run("calendar", *window, "--width", "100", *url).stdout
    assert all(len(line) <= 100 for line in shown.splitlines()), shown
    a, b = grid(shown, "host h-a"), grid(shown, "host h-b")
    per_day = len(a) // 7
    # 100 columns: 7 of borders, 8 of labels, 85 for 7 days.
    assert (len(a), len(b), per_day) == (84, 84, 12), shown
    assert a[per_day : 3 * per_day] == "A" * 2 * per_day
    assert set(a[:per_day] + a[3 * per_day :]) == {"|", "."}
    assert b[int(2.5 * per_day) : 4 * per_day] == "B" * int(1.5 * per_day)
    assert "B" not in b[: int(2.5 * per_day)] + b[4 * per_day :]
    assert a[0] == "|" and a[1] == "."  # a free day starts with its boundary
    # The legend (fitted to the width too, its ids folded): each mark's lease.
    legend = {
        line[2]: line
        for line in shown.splitlines()
        if line[:2] == "| " and line[2] != " " and line[3] == " "
    }
    assert legend.keys() == {"A", "B"}, shown
    for name, mark in (("alpha", "A"), ("beta", "B")):
        assert f"| {name} " in legend[mark] and leases[name]["id"][:8] in legend[mark]
        assert f"| PENDING | {fmt(_utc(leases[name]['start_date']))} |" in legend[mark]
    assert DAY0.strftime("%a %m-%d") in shown

    # Hours: day 2 from 12:00, one column an hour; beta starts half way.
    hours = run(
        "calendar", "--hours", "--start", day(2.25), "--end", day(2.75), "--width", "80", *url
    ).stdout
    b = grid(hours, "host h-b")
    per_hour = len(b) // 12
    assert per_hour == 5 and b == ("|" + "." * (per_hour - 1)) * 6 + "B" * 6 * per_hour, hours

    # Every lease here is the admin project's: another project's calendar has the hosts, free.
    other = run("calendar", *window, "--width", "100", "--project-id", "nobody", *url).stdout
    assert "A" not in grid(other, "host h-a") and "mark" not in other

    narrow = run("calendar", "--days", "90", "--width", "60", *url, ok=False)
    assert "90 days do not fit in 60 columns" in narrow.stderr


@pytest.mark.parametrize("columns", ["60", "40"])
def test_the_calendars_legend_fits_a_narrow_terminal(live_sqlite: LiveServer, columns: str) -> None:
    url = ("--url", live_sqlite.url)
    leases = seed(url)
    window = ("--start", DAY0.strftime("%Y-%m-%d"), "--days", "3", *url)
    shown = run("calendar", *window, env={"COLUMNS": columns}).stdout
    assert all(len(line) <= int(columns) for line in shown.splitlines()), shown
    legend = " ".join(shown[shown.index("A alpha") :].split())  # the paragraphs, unwrapped
    for name, mark in (("alpha", "A"), ("beta", "B")):
        lease = leases[name]
        start, end = fmt(_utc(lease["start_date"])), fmt(_utc(lease["end_date"]))
        said = f"{mark} {name}: PENDING, {start} to {end}, project admin, id {lease['id']}"
        assert said in legend, shown


def test_calendar_for_scripts_and_for_a_member(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    leases = seed(url)
    window = ("--start", DAY0.strftime("%Y-%m-%d"), "--days", "7", *url)
    found = run_json("calendar", *window)
    assert found["start_date"] == DAY0.strftime("%Y-%m-%dT%H:%M:%S.%f")
    by_name = {r["name"]: r for r in found["resources"]}
    assert set(by_name) == {"h-a", "h-b"}
    assert [a["lease_id"] for a in by_name["h-a"]["allocations"]] == [leases["alpha"]["id"]]
    assert [(lease["mark"], lease["name"]) for lease in found["leases"]] == [
        ("A", "alpha"),
        ("B", "beta"),
    ]
    assert yaml.safe_load(run("calendar", *window, "-f", "yaml").stdout) == found
    # A member may not list hosts: the rows are what its leases hold, by id.
    mine = run_json(
        "lease", "create", "mine", "--start", day(5), "--end", day(6), *url,
        "--project", "project-m",
    )  # fmt: skip
    member = run("calendar", *window, "--width", "100", "--project", "project-m").stdout
    host_id = mine["reservations"][0]["allocations"][0]["resource_id"]
    assert f"| host {host_id} " in member and "h-a" not in member and "alpha" not in member


def test_lease_create_wait_follows_it_until_active(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "h-a", *url)
    end = fmt(dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
    done = run("lease", "create", "soon", "--end", end, "--wait", "-f", "json", *url)
    assert json.loads(done.stdout)["status"] == "ACTIVE"
    assert "lease soon (" in done.stderr and done.stderr.rstrip().endswith("active")

    later = run(
        "lease", "create", "later", "--start", day(1), "--end", day(2), "--wait",
        "--wait-timeout", "1", *url, ok=False,
    )  # fmt: skip
    assert "waiting: starts at" in later.stderr
    assert "is not ACTIVE after 1 s (--wait-timeout)" in later.stderr
    assert "| later " in later.stdout  # shown as it is

    refused = run("lease", "create", "big", "--end", end, "--min", "2", "--wait", *url, ok=False)
    assert "error (409)" in refused.stderr
    bad = run("lease", "create", "x", "--end", end, "--wait", "--wait-timeout", "0", *url, ok=False)
    assert "--wait-timeout: must be a number of seconds above 0" in bad.stderr
    both = run("lease", "create", "x", "--end", end, "--wait", "--dry-run", *url, ok=False)
    assert "--wait and --dry-run" in both.stderr


def test_force_end_shows_the_lease_ended(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "h-a", *url)
    end = fmt(dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
    run("lease", "create", "running", "--end", end, "--wait", *url)
    ended = run_json("lease", "force-end", "running", *url)
    assert ended["status"] == "TERMINATED", ended
    assert run_json("lease", "show", "running", *url)["status"] == "TERMINATED"
    # The reason's date as every date of the table: UTC without its offset, a space for the T.
    (reason,) = [
        line
        for line in run("lease", "show", "running", *url).stdout.splitlines()
        if "reason" in line
    ]
    assert "end forced" in reason and "+00:00" not in reason and not re.search(r"\dT\d", reason)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("at 2026-12-07T16:43:32.645569+00:00", "at 2026-12-07 16:43:32.645569"),
        ("until 2030-06-01T11:00:00+02:00.", "until 2030-06-01 09:00."),
        ("2030-06-01T09:00:00.000000", "2030-06-01 09:00"),
        (
            "from 2030-06-01T09:00Z to 2030-06-01 10:00:30",
            "from 2030-06-01 09:00 to 2030-06-01 10:00:30",
        ),
        ("lease 12030-06-01T09:00 or 2030-06-01", "lease 12030-06-01T09:00 or 2030-06-01"),
    ],
)
def test_dates_in_messages_are_shown_as_in_tables(text: str, shown: str) -> None:
    from climate.cli.output import show_dates

    assert show_dates(text) == shown


def test_lease_create_wait_fails_when_the_lease_does_not_start(
    settings: Settings, sqlite_url: str
) -> None:
    failing = settings.model_copy(
        update={"backend": "faulty", "fault_rate": 1.0, "event_max_attempts": 1}
    )
    with serve(failing, sqlite_url) as server:
        url = ("--url", server.url)
        run("host", "create", "h-a", *url)
        end = fmt(dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
        done = run("lease", "create", "doomed", "--end", end, "--wait", *url, ok=False)
    assert done.returncode == 1
    assert "did not start: error" in done.stderr, done.stderr
    assert "| status " in done.stdout and "ERROR" in done.stdout


def test_names_as_well_as_ids(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    host = run_json("host", "create", "compute-x", *url)
    assert run_json("host", "show", "compute-x", *url)["id"] == host["id"]
    assert run_json("host", "update", "compute-x", "--extra", "rack=r9", *url)["rack"] == "r9"
    # A name of digits is found as a name; a number that is an id and a name is the id, said.
    digits = run_json("host", "create", "12345", *url)
    assert run_json("host", "show", "12345", *url)["id"] == digits["id"] != "12345"
    twin = run_json("host", "create", str(host["id"]), *url)
    both = run("host", "show", str(host["id"]), "-f", "json", *url)
    assert json.loads(both.stdout)["id"] == host["id"]
    assert f"'{host['id']}' is the id of host {host['id']} and the name of host {twin['id']}" in (
        both.stderr
    )
    segment = run_json("network", "create", "100", "--network-type", "vlan", *url)
    assert run_json("network", "show", "100", *url)["id"] == segment["id"]
    # A segment's id is unique per physical network: PHYSNET/SEGMENT names one of several.
    physnet = ("--network-type", "vlan", "--physical-network")
    one = run_json("network", "create", "200", *physnet, "physnet1", *url)
    two = run_json("network", "create", "200", *physnet, "physnet2", *url)
    assert run_json("network", "show", "physnet2/200", *url)["id"] == two["id"]
    several = run("network", "show", "200", *url, ok=False)
    assert f"2 networks are named '200': {one['id']} (physnet1/200), {two['id']}" in (
        several.stderr
    )
    assert "give an id or physical_network/segment_id such as physnet1/200" in several.stderr
    gone = run("network", "delete", "physnet1/200", *url).stdout
    assert gone.strip() == f"Deleted network {one['id']}"
    assert run_json("network", "show", "200", *url)["id"] == two["id"]
    device = run_json("device", "create", "fpga-0", *url)
    assert run_json("device", "show", "fpga-0", *url)["id"] == device["id"]
    missing = run("device", "show", "fpga-9", *url, ok=False)
    assert "no device with the id or name 'fpga-9'" in missing.stderr

    window = ("--start", day(1), "--end", day(2))
    a = run_json("lease", "create", "shared", *window, *url, "--project", "project-a")
    run("host", "create", "compute-y", *url)
    b = run_json("lease", "create", "shared", *window, *url, "--project", "project-b")
    # Each project sees one lease of that name; the admin sees both.
    as_a = ("--project", "project-a")
    assert run_json("lease", "show", "shared", *url, *as_a)["id"] == a["id"]
    ambiguous = run("lease", "show", "shared", *url, ok=False)
    assert "2 leases are named 'shared'" in ambiguous.stderr
    assert a["id"] in ambiguous.stderr and b["id"] in ambiguous.stderr
    assert "give an id" in ambiguous.stderr and "Traceback" not in ambiguous.stderr
    renamed = run_json("lease", "update", "shared", "--name", "mine", *url, *as_a)
    assert renamed["id"] == a["id"]
    assert run_json("lease", "show", "shared", *url)["id"] == b["id"]  # one left of that name
    assert run("lease", "delete", "mine", *url).stdout.strip() == f"Deleted lease {a['id']}"
    nothing = run("lease", "show", "mine", *url, ok=False)
    assert "no lease with the id or name 'mine'" in nothing.stderr


def test_output_formats_round_trip(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "h-a", "--extra", "note=a: b # c", *url)
    run("lease", "create", "l1", "--start", day(1), "--end", day(2), *url)
    for command in (("host", "show", "h-a"), ("lease", "list"), ("lease", "show", "l1")):
        as_json = run_json(*command, *url)
        assert json.loads(run(*command, "-f", "json", *url).stdout) == as_json
        assert yaml.safe_load(run(*command, "-f", "yaml", *url).stdout) == as_json
    table = run("lease", "list", "-f", "table", *url).stdout
    assert f"| {day(1)} " in table and f"| {day(2)} " in table  # the dates --start takes
    bad = run("lease", "list", "-f", "xml", *url, ok=False)
    assert "invalid choice: 'xml'" in bad.stderr


@contextlib.contextmanager
def config_file(tmp_path: Path, text: str) -> Iterator[str]:
    path = tmp_path / "climate.toml"
    path.write_text(f"[climate]\n{text}\n")
    yield str(path)


def test_the_server_is_found_as_the_other_tools_find_it(
    live_sqlite: LiveServer, tmp_path: Path
) -> None:
    port = str(live_sqlite.port)
    with config_file(tmp_path, f"port = {port}") as config:
        # Climate's own config file: where the server listens.
        assert run_json("--config", config, "host", "list") == []
        assert run_json("host", "list", env={"CLIMATE_CONFIG": config}) == []
        assert run_json("host", "list", env={"CLIMATE_PORT": port}) == []
        # OS_ENDPOINT (with /v1, as blazar takes it) before the config file...
        far = {"OS_ENDPOINT": UNREACHABLE + "/v1", "CLIMATE_CONFIG": config}
        assert f"cannot reach {UNREACHABLE}/v1/" in run("host", "list", env=far, ok=False).stderr
        near = {"OS_ENDPOINT": live_sqlite.url + "/v1", "OS_AUTH_TYPE": "none"}
        assert run_json("host", "list", env=near) == []
        # ...CLIMATE_URL before OS_ENDPOINT, --url before both.
        both = {**near, "CLIMATE_URL": UNREACHABLE}
        assert "cannot reach" in run("host", "list", env=both, ok=False).stderr
        assert run_json("host", "list", "--url", live_sqlite.url, env=both) == []
    with config_file(tmp_path, "port = 0") as config:
        bad = run("--config", config, "host", "list", ok=False)
        assert "port in" in bad.stderr and "Traceback" not in bad.stderr


def test_the_token_comes_from_the_options_climate_then_os_variables(
    settings: Settings, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'climate.db'}"
    db = ("--database-url", db_url)
    admin = run(
        "token", "create", "ops", "--user", "u", "--project", "p", "--roles", "admin", *db
    ).stdout.strip()
    with token_server(settings, db_url) as server:
        url = ("--url", server.url)
        assert run_json("host", "list", *url, env={"OS_TOKEN": admin}) == []
        wrong = {"OS_TOKEN": admin, "CLIMATE_TOKEN": "clm_wrong"}
        assert "error (401)" in run("host", "list", *url, env=wrong, ok=False).stderr
        assert run_json("host", "list", *url, "--token", admin, env=wrong) == []
        # OS_AUTH_TYPE=none: no token, as blazar does.
        none = {"OS_TOKEN": admin, "OS_AUTH_TYPE": "none"}
        assert "error (401)" in run("host", "list", *url, env=none, ok=False).stderr
        endpoint = {"OS_TOKEN": admin, "OS_ENDPOINT": server.url + "/v1"}
        assert run_json("host", "list", env=endpoint) == []
    # Keystone credentials: the client signs in (here: Keystone cannot be reached).
    keystone = {
        "OS_AUTH_URL": UNREACHABLE + "/v3",
        "OS_USERNAME": "alice",
        "OS_PASSWORD": "secret",
        "OS_PROJECT_NAME": "demo",
        "OS_USER_DOMAIN_NAME": "Default",
        "OS_PROJECT_DOMAIN_NAME": "Default",
    }
    refused = run("lease", "list", env=keystone, ok=False)
    assert f"OS_AUTH_URL: cannot reach Keystone at {UNREACHABLE}/v3" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = run("lease", "list", env={**keystone, "OS_PASSWORD": ""}, ok=False)
    assert "cannot sign in to Keystone" in missing.stderr and "OS_PASSWORD" in missing.stderr


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, child in action.choices.items():
            assert child.description, f"climate {' '.join((*path, name))}: no help text"
            yield from _leaves(child, (*path, name))


def test_every_subcommand_has_help_and_output_formats(capsys: pytest.CaptureFixture[str]) -> None:
    from climate.cli.main import main

    leaves = list(_leaves(_parser()))
    assert len(leaves) > 50
    for path, parser in leaves:
        options = {o for a in parser._actions for o in a.option_strings}
        for action in parser._actions:
            assert action.help, f"climate {' '.join(path)}: {action.dest} has no help"
        if "--url" in options or path in (("token", "list"), ("import-blazar",)):
            assert {"-f", "--format", "--json"} <= options, path
        with pytest.raises(SystemExit) as exited:
            main([*path, "--help"])
        assert exited.value.code == 0
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: climate {' '.join(path)}"), shown
        assert parser.description and parser.description.split()[0] in shown
    shown = run("lease", "create", "--help").stdout
    assert "--wait-timeout SECONDS" in shown and "-f {table,json,yaml}" in shown


def test_yaml_and_the_calendar_escape_control_characters_the_server_sends(
    live_sqlite: LiveServer,
) -> None:
    """A lease and a host named before names were checked (written to the database as they
    were then): YAML and the calendar show them escaped, never raw."""
    from climate.db.tables import Host, Lease

    url = ("--url", live_sqlite.url)
    seed(url)
    named = "x\u001b]0;pwn\u0007\u009b2J"
    with live_sqlite.ctx.db.transaction() as session:
        lease = session.query(Lease).filter_by(name="alpha").one()
        lease.name = named
        host = session.query(Host).filter_by(hypervisor_hostname="h-a").one()
        host.hypervisor_hostname = named
    window = ("--start", DAY0.strftime("%Y-%m-%d"), "--days", "7", "--width", "120", *url)
    printed = [run("lease", "list", "-f", "yaml", *url), run("calendar", *window)]
    for done in printed:
        for control in ("\u001b", "\u0007", "\u009b"):
            assert control not in done.stdout + done.stderr, done.stdout
    assert yaml.safe_load(printed[0].stdout)[0]["name"] in (named, "beta")
    assert "| host x\\x1b]0;pwn\\x07\\x9b2J " in printed[1].stdout
    assert "| x\\x1b]0;pwn\\x07\\x9b2J " in printed[1].stdout  # the legend
