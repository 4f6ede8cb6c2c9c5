"""Compatibility: the public ``blazar`` command (python-blazarclient 4.6.0) against Climate.

Each command runs as a subprocess against a live server, with ``OS_AUTH_TYPE=none`` and
``OS_ENDPOINT=<server>/v1`` (or an API token through ``OS_AUTH_TYPE=admin_token``), and its
output is parsed (``-f json`` where the command has it). A CLI call costs about half a second
of Python start-up, so setup and after-the-fact checks go straight to the API with httpx.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.domain.clock import SystemClock
from climate.runtime import build_context
from climate.services.tokens import TokenService
from tests.conftest import LiveServer, serve

BLAZAR = Path(sys.executable).with_name("blazar")
API_DATE = "%Y-%m-%d %H:%M"  # what the CLI takes
LEASE_DATE = "%Y-%m-%dT%H:%M:%S.%f"  # what the API returns for lease dates
A100 = 'resource_properties=["==","$gpu","a100"]'


def cli_env(server_url: str, **auth: str) -> dict[str, str]:
    """The caller's environment without any OpenStack settings, pointed at ``server_url``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(OS_ENDPOINT=f"{server_url}/v1", **auth)
    return env


@dataclass
class Blazar:
    """Runs the blazar command (or ``program``, such as ``openstack reservation``) with a fixed
    environment."""

    env: dict[str, str]
    program: tuple[str, ...] = (str(BLAZAR),)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.program, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, (
            f"{' '.join(self.program + args)} exited {result.returncode}:\n{result.stderr}"
        )
        return result.stdout

    def json(self, *args: str) -> Any:
        """The command's ``-f json`` output (after a "Created a new ...:" line, if any)."""
        lines = self.ok(*args, "-f", "json").splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(("{", "[")))
        return json.loads("\n".join(lines[start:]))

    def fails(self, *args: str) -> str:
        """Runs a command that must fail; returns what it printed."""
        result = self.run(*args)
        assert result.returncode != 0, (
            f"{' '.join(self.program + args)} succeeded:\n{result.stdout}"
        )
        return result.stderr + result.stdout


def objects(text: str) -> list[dict[str, Any]]:
    """A field the CLI shows as JSON objects one after another (lease-show's reservations)."""
    decoder = json.JSONDecoder()
    found = []
    position = 0
    text = text.strip()
    while position < len(text):
        value, position = decoder.raw_decode(text, position)
        found.append(value)
        while position < len(text) and text[position].isspace():
            position += 1
    return found


def lease_shown(blazar: Blazar, lease: str) -> dict[str, Any]:
    shown: dict[str, Any] = blazar.json("lease-show", lease)
    shown["reservations"] = objects(shown["reservations"])
    shown["events"] = objects(shown["events"])
    return shown


def wait_for_status(blazar: Blazar, lease: str, status: str) -> dict[str, Any]:
    """lease-show until the lease has ``status``, for up to about three seconds."""
    deadline = time.monotonic() + 3
    while True:
        shown = lease_shown(blazar, lease)
        if shown["status"] == status or time.monotonic() > deadline:
            assert shown["status"] == status, shown
            return shown
        time.sleep(0.1)


def minute(delta: dt.timedelta) -> dt.datetime:
    """Now plus ``delta`` in UTC, to the minute (the CLI's date precision)."""
    return (dt.datetime.now(dt.UTC) + delta).replace(second=0, microsecond=0)


def cli_date(when: dt.datetime) -> str:
    return when.strftime(API_DATE)


def lease_date(when: dt.datetime) -> str:
    return when.strftime(LEASE_DATE)


def parse_lease_date(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, LEASE_DATE).replace(tzinfo=dt.UTC)


def event_times(lease: dict[str, Any]) -> dict[str, str]:
    return {e["event_type"]: e["time"] for e in lease["events"]}


@pytest.fixture
def blazar(live_sqlite: LiveServer) -> Blazar:
    assert BLAZAR.exists(), f"{BLAZAR} is missing; install python-blazarclient==4.6.0"
    return Blazar(cli_env(live_sqlite.url, OS_AUTH_TYPE="none"))


def add_host(api: httpx.Client, name: str, **extra: str) -> str:
    response = api.post("/v1/os-hosts", json={"name": name, **extra})
    assert response.status_code == 201, response.text
    host_id: str = response.json()["host"]["id"]
    return host_id


def add_lease(
    api: httpx.Client, name: str, start: str, end: dt.datetime, properties: str = ""
) -> dict[str, Any]:
    body = {
        "name": name,
        "start_date": start,
        "end_date": cli_date(end),
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": 1,
                "max": 1,
                "hypervisor_properties": "",
                "resource_properties": properties,
            }
        ],
        "events": [],
    }
    response = api.post("/v1/leases", json=body)
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def api_lease(api: httpx.Client, lease_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/leases/{lease_id}")
    assert response.status_code == 200, response.text
    lease: dict[str, Any] = response.json()["lease"]
    return lease


def test_host_commands(blazar: Blazar, api: httpx.Client) -> None:
    created = blazar.json("host-create", "--extra", "gpu=a100", "--extra", "rack=r1", "node-1")
    assert created["id"].isdigit()
    assert (created["hypervisor_hostname"], created["gpu"], created["rack"]) == (
        "node-1",
        "a100",
        "r1",
    )
    assert created["reservable"] is True
    other = blazar.json("host-create", "--extra", "gpu=a100", "node-2")

    listed = blazar.json("host-list")
    assert [(h["id"], h["hypervisor_hostname"]) for h in listed] == [
        (created["id"], "node-1"),
        (other["id"], "node-2"),
    ]
    assert set(listed[0]) == {"id", "hypervisor_hostname", "vcpus", "memory_mb", "local_gb"}

    assert blazar.json("host-show", created["id"]) == created
    by_name = blazar.json("host-show", "node-2")
    assert (by_name["id"], by_name["gpu"]) == (other["id"], "a100")

    out = blazar.ok("host-update", "--extra", "gpu=h100", "--extra", "rack=r9", "node-2")
    assert "Updated host: node-2" in out
    host = api.get(f"/v1/os-hosts/{other['id']}").json()["host"]
    assert (host["gpu"], host["rack"]) == ("h100", "r9")
    assert host["updated_at"] is not None

    # The CLI sends every extra as text: "false" means what it says, as a JSON false would.
    blazar.ok("host-update", "--extra", "reservable=false", "node-2")
    assert api.get(f"/v1/os-hosts/{other['id']}").json()["host"]["reservable"] is False
    blazar.ok("host-update", "--extra", "reservable=True", "node-2")
    assert api.get(f"/v1/os-hosts/{other['id']}").json()["host"]["reservable"] is True
    refused = blazar.fails("host-update", "--extra", "reservable=maybe", "node-2")
    assert "reservable: must be true or false" in refused

    blazar.ok("host-unset", "--extra", "rack", other["id"])
    assert "rack" not in api.get(f"/v1/os-hosts/{other['id']}").json()["host"]

    assert "Deleted host: node-1" in blazar.ok("host-delete", "node-1")
    assert [h["id"] for h in api.get("/v1/os-hosts").json()["hosts"]] == [other["id"]]


def test_lease_commands(blazar: Blazar, api: httpx.Client) -> None:
    a100 = {add_host(api, "node-1", gpu="a100"), add_host(api, "node-2", gpu="a100")}
    add_host(api, "node-3", gpu="h100")
    end = minute(dt.timedelta(days=1))

    before = dt.datetime.now(dt.UTC)
    now_lease = blazar.json(
        "lease-create",
        "--physical-reservation",
        f"min=1,max=2,{A100}",
        "--start-date",
        "now",
        "--end-date",
        cli_date(end),
        "now-lease",
    )
    assert now_lease["name"] == "now-lease"
    assert now_lease["status"] in {"PENDING", "ACTIVE"}
    started = parse_lease_date(now_lease["start_date"])
    assert before - dt.timedelta(seconds=1) <= started <= dt.datetime.now(dt.UTC)
    assert now_lease["end_date"] == lease_date(end)
    (reservation,) = objects(now_lease["reservations"])
    assert (reservation["resource_type"], reservation["min"], reservation["max"]) == (
        "physical:host",
        1,
        2,
    )
    assert json.loads(reservation["resource_properties"]) == ["==", "$gpu", "a100"]
    held = {a["resource_id"] for a in reservation["allocations"]}
    assert 1 <= len(held) <= 2 and held <= a100

    active = wait_for_status(blazar, "now-lease", "ACTIVE")
    assert [r["status"] for r in active["reservations"]] == ["active"]
    assert {e["event_type"]: e["status"] for e in active["events"]}["start_lease"] == "DONE"

    start = minute(dt.timedelta(hours=2))
    future = blazar.json(
        "lease-create",
        "--physical-reservation",
        "min=1,max=1",
        "--start-date",
        cli_date(start),
        "--end-date",
        cli_date(end),
        "--before-end-date",
        cli_date(end - dt.timedelta(hours=3)),
        "future-lease",
    )
    assert future["status"] == "PENDING"
    assert (future["start_date"], future["end_date"]) == (lease_date(start), lease_date(end))
    assert event_times({"events": objects(future["events"])}) == {
        "start_lease": lease_date(start),
        "before_end_lease": lease_date(end - dt.timedelta(hours=3)),
        "end_lease": lease_date(end),
    }

    listed = blazar.json("lease-list")
    assert {(lease["name"], lease["id"]) for lease in listed} == {
        ("now-lease", now_lease["id"]),
        ("future-lease", future["id"]),
    }
    assert set(listed[0]) == {"id", "name", "start_date", "end_date"}

    assert "Updated lease: future-lease" in blazar.ok(
        "lease-update", "--name", "renamed", "future-lease"
    )
    assert api_lease(api, future["id"])["name"] == "renamed"

    blazar.ok("lease-update", "--prolong-for", "1d", "renamed")
    lease = api_lease(api, future["id"])
    prolonged = end + dt.timedelta(days=1)
    assert (lease["start_date"], lease["end_date"]) == (lease_date(start), lease_date(prolonged))
    # The before-end event keeps its distance from the end, as Blazar does.
    assert event_times(lease) == {
        "start_lease": lease_date(start),
        "before_end_lease": lease_date(prolonged - dt.timedelta(hours=3)),
        "end_lease": lease_date(prolonged),
    }

    blazar.ok("lease-update", "--reduce-by", "1h", "renamed")
    reduced = prolonged - dt.timedelta(hours=1)
    assert api_lease(api, future["id"])["end_date"] == lease_date(reduced)

    new_end = minute(dt.timedelta(days=3, hours=5))
    blazar.ok("lease-update", "--end-date", cli_date(new_end), "renamed")
    shown = lease_shown(blazar, "renamed")
    assert (shown["id"], shown["name"], shown["status"]) == (future["id"], "renamed", "PENDING")
    assert (shown["start_date"], shown["end_date"]) == (lease_date(start), lease_date(new_end))
    assert event_times(shown)["end_lease"] == lease_date(new_end)
    (allocation,) = shown["reservations"][0]["allocations"]
    assert allocation["end_date"] == lease_date(new_end)

    assert "Deleted lease: renamed" in blazar.ok("lease-delete", "renamed")
    remaining = api.get("/v1/leases").json()["leases"]
    assert [lease["name"] for lease in remaining] == ["now-lease"]


def test_a_running_lease_given_the_current_minute_as_its_end_ends_now(
    blazar: Blazar, api: httpx.Client
) -> None:
    """The CLI takes dates to the minute and refuses "now" as an end: Blazar, comparing with
    "now" to the minute too, takes the current minute as "end it now", and so does Climate."""
    add_host(api, "node-1")
    lease = add_lease(api, "running", "now", minute(dt.timedelta(hours=1)))
    wait_for_status(blazar, "running", "ACTIVE")
    if dt.datetime.now(dt.UTC).second > 50:  # the minute given must still be the current one
        time.sleep(11)
    this_minute = minute(dt.timedelta())
    assert "Updated lease: running" in blazar.ok(
        "lease-update", "--end-date", cli_date(this_minute), "running"
    )
    ended = parse_lease_date(api_lease(api, lease["id"])["end_date"])
    assert this_minute <= ended <= dt.datetime.now(dt.UTC)
    wait_for_status(blazar, "running", "TERMINATED")


def test_lease_that_cannot_fit_is_refused(blazar: Blazar, api: httpx.Client) -> None:
    add_host(api, "node-1")
    add_host(api, "node-2")
    end = cli_date(minute(dt.timedelta(days=1)))

    too_many = blazar.fails(
        "lease-create", "--physical-reservation", "min=3,max=3", "--end-date", end, "too-big"
    )
    assert "ERROR:" in too_many and "Not enough hosts available" in too_many
    assert api.get("/v1/leases").json()["leases"] == []


def test_allocation_commands_and_host_delete_while_held(blazar: Blazar, api: httpx.Client) -> None:
    held_id = add_host(api, "node-1", slot="a")
    free_id = add_host(api, "node-2", slot="b")
    slot_a = '["==","$slot","a"]'
    running = add_lease(api, "running", "now", minute(dt.timedelta(hours=1)), slot_a)
    later = add_lease(
        api,
        "later",
        cli_date(minute(dt.timedelta(hours=2))),
        minute(dt.timedelta(hours=3)),
        slot_a,
    )
    reservation_of = {lease["id"]: lease["reservations"][0]["id"] for lease in (running, later)}

    allocations = blazar.json("allocation-list", "host")
    assert [a["resource_id"] for a in allocations] == [held_id, free_id]
    assert allocations[1]["reservations"] == []
    assert [(r["lease_id"], r["id"]) for r in allocations[0]["reservations"]] == [
        (running["id"], reservation_of[running["id"]]),
        (later["id"], reservation_of[later["id"]]),
    ]
    later_entry = allocations[0]["reservations"][1]
    assert (later_entry["start_date"], later_entry["end_date"]) == (
        later["start_date"],
        later["end_date"],
    )

    only_later = blazar.json("allocation-list", "host", "--lease-id", later["id"])
    assert [[r["lease_id"] for r in a["reservations"]] for a in only_later] == [[later["id"]], []]

    shown = blazar.json("allocation-show", "host", "node-1")
    assert shown["resource_id"] == held_id
    assert [r["lease_id"] for r in objects(shown["reservations"])] == [running["id"], later["id"]]
    filtered = blazar.json("allocation-show", "host", "node-1", "--lease-id", running["id"])
    (entry,) = objects(filtered["reservations"])
    assert entry == {
        "id": reservation_of[running["id"]],
        "lease_id": running["id"],
        "start_date": running["start_date"],
        "end_date": running["end_date"],
    }

    refused = blazar.fails("host-delete", "node-1")
    assert "ERROR:" in refused
    assert running["id"] in refused and later["id"] in refused
    assert [h["id"] for h in api.get("/v1/os-hosts").json()["hosts"]] == [held_id, free_id]

    blazar.ok("lease-delete", "running")
    assert api.delete(f"/v1/leases/{later['id']}").status_code == 204
    assert "Deleted host: node-1" in blazar.ok("host-delete", "node-1")
    assert [h["id"] for h in api.get("/v1/os-hosts").json()["hosts"]] == [free_id]


@pytest.fixture
def token_server(sqlite_url: str) -> Iterator[LiveServer]:
    settings = load_settings(env={}, auth="token", event_retry_base_seconds=0.0)
    database = Database(sqlite_url)
    with LiveServer(build_context(settings, database, SystemClock())) as server:
        yield server
    database.dispose()


def test_token_mode(token_server: LiveServer) -> None:
    tokens = TokenService(token_server.ctx)
    operator = tokens.issue("ops", "ops-user", "ops-project", ["admin"])
    member = tokens.issue("carol", "carol", "project-c", ["member"])

    def as_token(token: str) -> Blazar:
        return Blazar(cli_env(token_server.url, OS_AUTH_TYPE="admin_token", OS_TOKEN=token))

    host = as_token(operator.token).json("host-create", "--extra", "gpu=a100", "node-1")
    assert host["hypervisor_hostname"] == "node-1"

    carol = as_token(member.token)
    lease = carol.json(
        "lease-create",
        "--physical-reservation",
        f"min=1,max=1,{A100}",
        "--end-date",
        cli_date(minute(dt.timedelta(hours=4))),
        "carol-lease",
    )
    assert (lease["user_id"], lease["project_id"]) == ("carol", "project-c")
    assert "Policy doesn't allow blazar:oshosts:get" in carol.fails("host-list")

    bad = as_token(operator.token + "x").run("--debug", "host-list")
    assert bad.returncode != 0
    assert "RESP: [401]" in bad.stderr
    assert "ERROR: the token is unknown, expired or revoked" in bad.stderr


def test_cli_smoke_on_each_database(live: LiveServer) -> None:
    """Create a host and a lease, see it start, delete it: on SQLite and on PostgreSQL."""
    blazar = Blazar(cli_env(live.url, OS_AUTH_TYPE="none"))
    host = blazar.json("host-create", "--extra", "gpu=a100", "node-1")
    lease = blazar.json(
        "lease-create",
        "--physical-reservation",
        f"min=1,max=1,{A100}",
        "--end-date",
        cli_date(minute(dt.timedelta(hours=4))),
        "smoke",
    )
    (reservation,) = objects(lease["reservations"])
    assert [a["resource_id"] for a in reservation["allocations"]] == [host["id"]]
    active = wait_for_status(blazar, "smoke", "ACTIVE")
    assert [r["status"] for r in active["reservations"]] == ["active"]
    assert "Deleted lease: smoke" in blazar.ok("lease-delete", "smoke")
    with httpx.Client(base_url=live.url, timeout=10, trust_env=False) as api:
        assert api.get("/v1/leases").json()["leases"] == []


def test_floating_ip_commands_and_reservation(blazar: Blazar, api: httpx.Client) -> None:
    network = "1e17587e-a7ed-4b82-a17b-4beb32523e28"
    created = blazar.json("floatingip-create", network, "172.24.4.101")
    assert (created["floating_network_id"], created["floating_ip_address"]) == (
        network,
        "172.24.4.101",
    )
    # Blazar's floating IPs always have a subnet_id; with no Neutron to ask, Climate's is empty.
    assert created["subnet_id"] in ("", None)
    blazar.ok("floatingip-create", network, "172.24.4.102")
    listed = blazar.json("floatingip-list")
    assert sorted(f["floating_ip_address"] for f in listed) == ["172.24.4.101", "172.24.4.102"]
    assert blazar.json("floatingip-show", created["id"])["id"] == created["id"]

    end = cli_date(minute(dt.timedelta(days=1)))
    reservation = (
        f"resource_type=virtual:floatingip,network_id={network},amount=1,"
        'required_floatingips=["172.24.4.102"]'
    )
    blazar.ok("lease-create", "--reservation", reservation, "--end-date", end, "ips")
    (shown,) = lease_shown(blazar, "ips")["reservations"]
    assert shown["resource_type"] == "virtual:floatingip"
    assert (shown["network_id"], shown["amount"]) == (network, 1)
    assert shown["required_floatingips"] == ["172.24.4.102"]
    (allocation,) = shown["allocations"]
    second = next(f for f in listed if f["floating_ip_address"] == "172.24.4.102")
    assert allocation["resource_id"] == second["id"]

    refused = blazar.fails("lease-create", "--reservation", reservation, "--end-date", end, "again")
    assert "ERROR:" in refused and "172.24.4.102 not free" in refused
    held = blazar.fails("floatingip-delete", second["id"])
    assert "current or future allocations" in held
    blazar.ok("floatingip-delete", created["id"])


def test_instance_reservation(blazar: Blazar, api: httpx.Client) -> None:
    first = add_host(api, "compute-1", vcpus="8", memory_mb="8192", local_gb="100")
    second = add_host(api, "compute-2", vcpus="8", memory_mb="8192", local_gb="100")
    end = cli_date(minute(dt.timedelta(days=1)))
    reservation = (
        "resource_type=virtual:instance,amount=2,vcpus=2,memory_mb=2048,disk_gb=20,affinity=False"
    )
    blazar.ok("lease-create", "--reservation", reservation, "--end-date", end, "vms")
    (shown,) = lease_shown(blazar, "vms")["reservations"]
    assert shown["resource_type"] == "virtual:instance"
    assert (shown["amount"], shown["vcpus"], shown["memory_mb"], shown["disk_gb"]) == (
        2,
        2,
        2048,
        20,
    )
    assert shown["affinity"] is False
    assert shown["flavor_id"] == shown["id"]
    assert sorted(h["host_id"] for h in shown["hosts"]) == sorted([first, second])
    assert [a["count"] for a in shown["allocations"]] == [1, 1]

    too_big = reservation.replace("vcpus=2", "vcpus=64")
    refused = blazar.fails("lease-create", "--reservation", too_big, "--end-date", end, "big")
    assert "vcpus: no host has 64 vCPUs" in refused


def test_names_are_found_past_max_page_size(settings: Settings, sqlite_url: str) -> None:
    """blazar finds a lease or host by name in the whole list (it never pages): lists without
    ``limit`` are whole, whatever ``max_page_size`` caps a page at."""
    with serve(settings.model_copy(update={"max_page_size": 2}), sqlite_url) as server:
        blazar = Blazar(cli_env(server.url, OS_AUTH_TYPE="none"))
        with httpx.Client(base_url=server.url, timeout=30) as api:
            for i in range(3):
                add_host(api, f"compute-{i}")
            start = minute(dt.timedelta(days=1))
            for i in range(3):
                hour = dt.timedelta(hours=1)
                add_lease(api, f"lease-{i}", cli_date(start + i * hour), start + (i + 1) * hour)
        assert [x["name"] for x in blazar.json("lease-list")] == ["lease-0", "lease-1", "lease-2"]
        assert lease_shown(blazar, "lease-2")["name"] == "lease-2"
        assert blazar.json("host-show", "compute-2")["hypervisor_hostname"] == "compute-2"
        blazar.ok("lease-delete", "lease-2")
        assert len(blazar.json("host-list")) == 3
