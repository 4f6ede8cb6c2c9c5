"""The ``climate`` command line for every resource type and lease type, run as a real subprocess
against a live server: the inventories, allocations, ``--reservation`` leases, lease types and
holds."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.test_cli import fmt, run, run_json

T0 = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
START, END = fmt(T0 + dt.timedelta(days=1)), fmt(T0 + dt.timedelta(days=2))
NO_LEASE = "00000000-0000-4000-8000-000000000000"
# kind: create arguments, fields the created object shows, a --reservation that takes it.
KINDS: dict[str, tuple[list[str], dict[str, Any], str]] = {
    "device": (
        ["gpu-0", "--extra", "model=a100"],
        {"name": "gpu-0"},
        'resource_type=device,min=1,max=1,resource_properties=["==","$rack","r1"]',
    ),
    "network": (
        [
            "100",
            "--physical-network",
            "physnet1",
            "--network-type",
            "vlan",
            "--extra",
            "model=a100",
        ],
        {"segment_id": "100", "physical_network": "physnet1", "network_type": "vlan"},
        'resource_type=network,amount=1,network_properties=["==","$physical_network","physnet1"]',
    ),
    "floatingip": (
        ["ext-net", "172.24.4.10", "--extra", "model=a100"],
        {"floating_network_id": "ext-net", "floating_ip_address": "172.24.4.10"},
        "resource_type=virtual:floatingip,network_id=ext-net,amount=1",
    ),
    "volume-pool": (
        ["ssd-1", "--capacity-gb", "100", "--extra", "model=a100"],
        {"name": "ssd-1", "capacity_gb": 100},
        "resource_type=virtual:volume,size_gb=30,amount=2,pool=ssd-1",
    ),
}


def wire(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")


def lease(url: tuple[str, ...], name: str, *options: str) -> dict[str, Any]:
    found: dict[str, Any] = run_json("lease", "create", name, *options, *url)
    return found


@pytest.mark.parametrize("kind", list(KINDS))
def test_inventory_commands(live_sqlite: LiveServer, kind: str) -> None:
    url = ("--url", live_sqlite.url)
    arguments, fields, reservation = KINDS[kind]
    created = run_json(kind, "create", *arguments, *url)
    assert {k: created[k] for k in fields} == fields
    assert (created["model"], created["reservable"]) == ("a100", True)
    item_id = created["id"]

    assert run_json(kind, "list", *url) == [created]
    listed = run(kind, "list", *url).stdout
    assert all(str(value) in listed for value in fields.values())
    assert run_json(kind, "show", item_id, *url) == created
    assert "| model " in run(kind, "show", item_id, *url).stdout

    changes = ["--extra", "rack=r1", "--unset", "model", "--reservable", "false"]
    if kind == "volume-pool":
        changes += ["--capacity-gb", "120"]
    updated = run_json(kind, "update", item_id, *changes, *url)
    assert (updated["rack"], updated["reservable"], "model" in updated) == ("r1", False, False)
    assert updated.get("capacity_gb", 120) == 120
    window = ("--start", START, "--end", END, "--reservation", reservation)
    unreservable = run("lease", "create", "none", *window, *url, ok=False)
    assert "error (4" in unreservable.stderr  # 409, or 400 for an empty floating network
    assert run_json(kind, "update", item_id, "--reservable", "true", *url)["reservable"] is True
    nothing = run(kind, "update", item_id, *url, ok=False)
    assert "nothing to update" in nothing.stderr

    held = lease(url, f"{kind}-lease", *window)
    [allocation] = run_json(kind, "allocations", "--start", START, *url)
    assert allocation["resource_id"] == item_id
    assert [r["lease_id"] for r in allocation["reservations"]] == [held["id"]]
    if kind == "volume-pool":
        assert allocation["reservations"][0]["size_gb"] == 60
    one = run_json(kind, "allocations", item_id, "--lease-id", held["id"], *url)
    assert one == allocation
    other = run_json(kind, "allocations", "--lease-id", NO_LEASE, "--limit", "1", *url)
    assert other == [{"resource_id": item_id, "reservations": []}]
    table = run(kind, "allocations", *url).stdout
    assert held["id"] in table and "reservation_id" in table

    in_use = run(kind, "delete", item_id, *url, ok=False)
    assert "error (409)" in in_use.stderr and held["id"] in in_use.stderr
    run("lease", "delete", held["id"], *url)
    assert run(kind, "delete", item_id, *url).stdout.strip() == f"Deleted {kind} {item_id}"
    assert run_json(kind, "list", *url) == []
    missing = run(kind, "show", item_id, *url, ok=False)
    assert f"no {kind} with the id or name '{item_id}'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_create_errors_print_the_apis_message(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("floatingip", "create", "ext-net", "172.24.4.10", *url)
    duplicate = run("floatingip", "create", "ext-net", "172.24.4.10", *url, ok=False)
    assert "error (409)" in duplicate.stderr and "172.24.4.10" in duplicate.stderr
    bad = run("floatingip", "create", "ext-net", "172.24.4.300", *url, ok=False)
    assert "error (400)" in bad.stderr and "floating_ip_address" in bad.stderr
    untyped = run("network", "create", "7", *url, ok=False)
    assert "error (400)" in untyped.stderr and "network_type" in untyped.stderr
    small = run("volume-pool", "create", "p", "--capacity-gb", "0", *url, ok=False)
    assert "error (400)" in small.stderr and "capacity_gb" in small.stderr
    member = run("device", "list", *url, "--project", "project-a", ok=False)
    assert "error (403)" in member.stderr


def test_a_lease_mixing_instances_a_floating_ip_and_a_device(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    host = run_json(
        "host",
        "create",
        "compute-0",
        *(f"--extra={k}" for k in ("vcpus=8", "memory_mb=8192")),
        "--extra",
        "local_gb=100",
        *url,
    )
    device = run_json("device", "create", "fpga-0", "--extra", "vendor=xilinx", *url)
    run("floatingip", "create", "ext-net", "172.24.4.10", *url)
    address = run_json("floatingip", "create", "ext-net", "172.24.4.11", *url)
    mixed = lease(
        url,
        "mixed",
        "--start", START,
        "--end", END,
        "--reservation", "resource_type=virtual:instance,amount=2,vcpus=2,memory_mb=2048,"
        "disk_gb=10,affinity=true",
        "--reservation", 'resource_type=virtual:floatingip,network_id=ext-net,amount=1,'
        'required_floatingips=["172.24.4.11"]',
        "--reservation", "resource_type=device,min=1,max=1",
    )  # fmt: skip
    instances, floating, devices = mixed["reservations"]
    assert (instances["resource_type"], instances["amount"], instances["affinity"]) == (
        "virtual:instance",
        2,
        True,
    )
    assert instances["hosts"] == [{"host_id": host["id"], "count": 2}]
    assert floating["required_floatingips"] == ["172.24.4.11"]
    assert [a["resource_id"] for a in floating["allocations"]] == [address["id"]]
    assert [a["resource_id"] for a in devices["allocations"]] == [device["id"]]

    shown = run("lease", "show", mixed["id"], *url).stdout
    assert "2 x 2 vCPU, 2048 MB, 10 GB, affinity True" in shown
    assert "compute-0 x2" in shown and "fpga-0" in shown
    assert "1 from network ext-net incl. 172.24.4.11" in shown
    # A member may not read the inventories: the ids stand for the names.
    own = run("lease", "show", mixed["id"], *url, "--project", mixed["project_id"]).stdout
    assert f"{host['id']} x2" in own

    [on_host] = run_json("instance", "allocations", "--start", START, *url)
    assert on_host["resource_id"] == host["id"]
    assert [(r["lease_id"], r["count"]) for r in on_host["reservations"]] == [(mixed["id"], 2)]
    assert run_json("instance", "allocations", host["id"], "--start", START, *url) == on_host
    assert run_json("instance", "allocations", "--lease-id", NO_LEASE, *url) == []
    assert "count" in run("instance", "allocations", "--start", START, *url).stdout
    unknown = run("instance", "allocations", "999", *url, ok=False)
    assert "no host with the id or name '999'" in unknown.stderr


def test_lease_types_holds_and_the_queue(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "compute-0", *url)
    now_end = fmt(T0 + dt.timedelta(hours=3))
    active = lease(url, "now", "--type", "immediate", "--end", now_end)
    assert (active["status"], active["lease_type"]) == ("ACTIVE", "immediate")

    waiting = lease(
        url, "wait", "--type", "retry", "--max-attempts", "3", "--priority", "5", "--end", now_end
    )
    assert (waiting["status"], waiting["retries"], waiting["priority"]) == ("IN_PROGRESS", 3, 5)
    listed = run("lease", "list", *url).stdout
    assert "lease_type" in listed and "queue_position" in listed
    assert [
        w["queue_position"] for w in run_json("lease", "list", *url) if w["id"] == waiting["id"]
    ] == [1]
    run("lease", "delete", waiting["id"], *url)

    held = lease(url, "held", "--start", START, "--end", END, "--hold", "10m")
    assert held["status"] == "HELD" and held["hold_expires_at"] is not None
    confirmed = run_json("lease", "confirm", held["id"], *url)
    assert (confirmed["status"], confirmed["hold_expires_at"]) == ("PENDING", None)
    again = run("lease", "confirm", held["id"], *url, ok=False)
    assert "error (409)" in again.stderr

    hunting = lease(
        url, "hunt", "--type", "best_effort", "--end", now_end,
        "--deadline", fmt(T0 + dt.timedelta(days=3)),
    )  # fmt: skip
    assert (hunting["status"], hunting["lease_type"]) == ("IN_PROGRESS", "best_effort")
    assert hunting["deadline"] is not None


def inventory(url: tuple[str, ...]) -> dict[str, Any]:
    """One of each: a host sized for instances, a device, a segment, a floating IP, a pool."""
    sizes = ("--extra", "vcpus=8", "--extra", "memory_mb=8192", "--extra", "local_gb=100")
    return {
        "host": run_json("host", "create", "compute-0", *sizes, *url),
        "device": run_json("device", "create", "gpu-0", *url),
        "network": run_json(
            "network", "create", "100", "--network-type", "vlan", "--physical-network", "physnet1",
            *url,
        ),
        "floatingip": run_json("floatingip", "create", "ext-net", "172.24.4.10", *url),
        "volume-pool": run_json("volume-pool", "create", "ssd-1", "--capacity-gb", "100", *url),
    }  # fmt: skip


INSTANCES = "resource_type=virtual:instance,amount=2,vcpus=2,memory_mb=2048,disk_gb=10"
FLOATING_IP = "resource_type=virtual:floatingip,network_id=ext-net,amount=1"
VOLUME = "resource_type=virtual:volume,size_gb=30,amount=2,pool=ssd-1"


def test_availability_search_of_instances_a_floating_ip_and_a_volume(
    live_sqlite: LiveServer,
) -> None:
    url = ("--url", live_sqlite.url)
    made = inventory(url)
    taken = lease(url, "ip", "--start", START, "--end", END, "--reservation", FLOATING_IP)
    later = T0 + dt.timedelta(days=2, hours=1)
    lease(url, "cpu", "--start", START, "--end", fmt(later), "--reservation", INSTANCES)
    search = (
        "availability", "search", "--duration", "1:00", "--start", START,
        "--end", fmt(T0 + dt.timedelta(days=3)), "--limit", "3",
        "--reservation", INSTANCES, "--reservation", FLOATING_IP, "--reservation", VOLUME, *url,
    )  # fmt: skip

    windows = run_json(*search)
    # The only floating IP is taken until END, half the host's room for an hour more.
    starts = [taken["end_date"], wire(later)]
    assert [w["start_date"] for w in windows] == starts
    assert [w["reservations"][0]["available"] for w in windows] == [2, 4]
    instances, floating, volume = windows[0]["reservations"]
    host_id = made["host"]["id"]
    assert instances["placement"] == [{"host": host_id, "count": 2, "host_name": "compute-0"}]
    assert floating["items"] == [
        {"id": made["floatingip"]["id"], "floating_ip_address": "172.24.4.10"}
    ]
    assert (volume["pool"], volume["gb"], volume["available"]) == ("ssd-1", 60, 100)

    rows = [line for line in run(*search).stdout.splitlines() if line.startswith("| ")]
    assert rows[0].split() == ["|", "start_date", "|", "end_date", "|", "free", "|", "grant",
                               "|", "type", "|"]  # fmt: skip
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows[1:]]
    # Tables show dates in the one format the options take.
    shown = [fmt(T0 + dt.timedelta(days=2)), fmt(later), fmt(later + dt.timedelta(hours=1))]
    assert cells == [
        [shown[0], shown[1], "2", "compute-0 x2", "virtual:instance"],
        ["", "", "1", "172.24.4.10", "virtual:floatingip"],
        ["", "", "100", "60 GB from pool ssd-1", "virtual:volume"],
        [shown[1], shown[2], "4", "compute-0 x2", "virtual:instance"],
        ["", "", "1", "172.24.4.10", "virtual:floatingip"],
        ["", "", "100", "60 GB from pool ssd-1", "virtual:volume"],
    ]
    # A member sees host ids, as in the JSON answer; item and pool names are not secret.
    member = run(*search, "--project", "project-a").stdout
    assert f"| {host_id} x2 " in member and "172.24.4.10" in member and "compute-0" not in member


TIMELINES: list[tuple[list[str], str, int, list[dict[str, int]]]] = [
    # options, unit, total, the two buckets (the lease's day, the day after)
    ([], "hosts", 1, [{"free": 0, "busy": 1, "partly_busy": 0}, {"free": 1}]),
    (
        ["--resource-type", "virtual:instance", "--vcpus", "2", "--memory-mb", "2048"],
        "instances",
        4,
        [{"free": 2, "largest": 2}, {"free": 4, "largest": 4}],
    ),
    (["--resource-type", "device"], "devices", 1, [{"free": 0, "busy": 1}, {"free": 1}]),
    (
        ["--resource-type", "network", "--pool", "physnet1"],
        "network segments",
        1,
        [{"free": 1, "busy": 0}, {"free": 1}],
    ),  # fmt: skip
    (
        ["--resource-type", "virtual:floatingip", "--pool", "ext-net"],
        "floating IPs",
        1,
        [{"free": 0, "busy": 1}, {"free": 1}],
    ),  # fmt: skip
    (
        ["--resource-type", "virtual:volume", "--pool", "ssd-1"],
        "GB",
        100,
        [{"free": 40, "largest": 40}, {"free": 100, "largest": 100}],
    ),  # fmt: skip
]


def test_availability_timeline_of_every_type(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    inventory(url)
    lease(url, "busy", "--start", START, "--end", END, *(
        arg for r in (INSTANCES, FLOATING_IP, VOLUME, "resource_type=device,min=1,max=1")
        for arg in ("--reservation", r)
    ))  # fmt: skip
    window = ("--start", START, "--end", fmt(T0 + dt.timedelta(days=3)), "--bucket", "86400")
    headings = []
    for options, unit, total, buckets in TIMELINES:
        found = run_json("availability", "timeline", *window, *options, *url)
        assert (found["unit"], found["total"]) == (unit, total), options
        assert ("hosts" in found) == (unit == "hosts")
        assert [
            {k: b[k] for k in want} for b, want in zip(found["buckets"], buckets, strict=True)
        ] == buckets
        shown = run("availability", "timeline", *window, *options, *url).stdout
        headings.append(shown.splitlines()[0])
        columns = shown.splitlines()[2].split()
        assert columns[3:6:2] == (["free", "largest"] if "largest" in buckets[0] else
                                   ["free", "partly_busy"]), shown  # fmt: skip
    assert headings == [
        "1 matching host(s), buckets of 86400 s",
        "4 instance(s) of this size fit the matching hosts when empty, buckets of 86400 s",
        "1 matching device(s), buckets of 86400 s",
        "1 matching network segment(s), buckets of 86400 s",
        "1 matching floating IP(s), buckets of 86400 s",
        "100 GB in the matching pool(s), buckets of 86400 s",
    ]


@pytest.mark.parametrize(
    ("options", "mentions"),
    [
        (["search", "--reservation", FLOATING_IP, "--min", "2"], ["--reservation replaces"]),
        (["search", "--reservation", FLOATING_IP, "--properties", "[]"], ["--properties"]),
        (["search", "--reservation", "network_id=ext-net"], ["names no resource_type"]),
        (
            ["search", "--reservation", "resource_type=virtual:floatingip,amount=0,network_id=x"],
            ["error (400)", "reservations[0].amount"],
        ),  # fmt: skip
        (["timeline", "--vcpus", "2"], ["error (400)", "vcpus: only for virtual:instance"]),
        (["timeline", "--pool", "ssd-1"], ["error (400)", "pool: not for physical:host"]),
        (
            ["timeline", "--resource-type", "virtual:instance", "--vcpus", "2"],
            ["error (400)", "memory_mb: required"],
        ),  # fmt: skip
        (
            ["timeline", "--resource-type", "virtual:volume", "--memory-mb", "1"],
            ["error (400)", "memory_mb: only for virtual:instance"],
        ),  # fmt: skip
        (["timeline", "--resource-type", "gpu"], ["error (400)", "resource_type"]),
        (["timeline", "--disk-gb", "ten"], ["--disk-gb", "invalid int value"]),
    ],
)
def test_bad_availability_options_exit_non_zero_naming_them(
    live_sqlite: LiveServer, options: list[str], mentions: list[str]
) -> None:
    action, *rest = options
    window = ["--end", END] + (["--duration", "1:00"] if action == "search" else [])
    done = run("availability", action, *window, *rest, "--url", live_sqlite.url, ok=False)
    assert all(m in done.stderr for m in mentions), done.stderr
    assert "Traceback" not in done.stderr


def test_a_refused_lease_of_any_type_prints_offers_to_paste(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    inventory(url)
    taken = lease(url, "ip", "--start", START, "--end", END, "--reservation", FLOATING_IP)
    refused = run(
        "lease", "create", "late", "--start", START, "--end", END,
        "--reservation", INSTANCES, "--reservation", FLOATING_IP, *url, ok=False,
    )  # fmt: skip
    assert "error (409)" in refused.stderr and "Traceback" not in refused.stderr
    offers = dict(
        line.strip().split(": ", 1) for line in refused.stderr.splitlines() if line.startswith("  ")
    )
    assert set(offers) == {"later_start"}, refused.stderr
    later = shlex.split(offers["later_start"])
    assert later[:4] == ["--start", END, "--end", later[3]]
    accepted = lease(url, "late", *later)
    assert [r["resource_type"] for r in accepted["reservations"]] == [
        "virtual:instance",
        "virtual:floatingip",
    ]
    assert accepted["start_date"] == taken["end_date"]


def test_lease_update_changes_a_reservations_amounts(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    for name in ("h-0", "h-1", "h-2"):
        run("host", "create", name, *url)
    for segment in ("100", "101"):
        run("network", "create", segment, "--network-type", "vlan", *url)
    hosts = lease(url, "hosts", "--start", START, "--end", END)
    grown = run_json("lease", "update", "hosts", "--min", "2", "--max", "3", *url)
    (changed,) = grown["reservations"]
    assert (changed["id"], changed["min"], changed["max"]) == (
        hosts["reservations"][0]["id"],
        2,
        3,
    )
    assert len(changed["allocations"]) == 3

    both = lease(
        url,
        "both",
        "--start",
        START,
        "--end",
        END,
        "--reservation",
        "resource_type=network,amount=1",
    )
    mixed = lease(
        url, "mixed", "--start", END, "--end", fmt(T0 + dt.timedelta(days=3)),
        "--reservation", "resource_type=network,amount=1",
        "--reservation", "resource_type=physical:host,min=1,max=1",
    )  # fmt: skip
    unsaid = run("lease", "update", "mixed", "--amount", "2", *url, ok=False)
    assert "has 2 reservations; give --reservation-id" in unsaid.stderr, unsaid.stderr
    segments = mixed["reservations"][0]["id"]
    assert segments in unsaid.stderr and "(network)" in unsaid.stderr
    said = run_json("lease", "update", "mixed", "--amount", "2", "--reservation-id", segments, *url)
    assert [r.get("amount") for r in said["reservations"]] == [2, None]
    assert (
        run_json("lease", "update", "both", "--amount", "2", *url)["reservations"][0]["amount"] == 2
    )
    assert both["reservations"][0]["amount"] == 1
    alone = run("lease", "update", "both", "--reservation-id", segments, *url, ok=False)
    assert "--reservation-id goes with --min, --max or --amount" in alone.stderr


@pytest.mark.parametrize(
    ("options", "mentions"),
    [
        (["--reservation", "amount=2,vcpus=2"], ["resource_type", "amount=2,vcpus=2"]),
        (["--reservation", "resource_type=device,min"], ["'min'", "key=value"]),
        (["--reservation", "resource_type=device,=1"], ["'=1'", "key=value"]),
        (["--reservation", "resource_type=device,min=1,min=2"], ["min twice"]),
        (["--reservation", "resource_type=device", "--min", "2"], ["--reservation replaces"]),
        (["--hold", "soon"], ["--hold", "'soon'"]),
        (["--type", "eventually"], ["invalid choice"]),
    ],
)
def test_bad_lease_options_exit_non_zero_naming_them(
    live_sqlite: LiveServer, options: list[str], mentions: list[str]
) -> None:
    done = run("lease", "create", "x", "--end", END, *options, "--url", live_sqlite.url, ok=False)
    assert all(m in done.stderr for m in mentions), done.stderr
    assert "Traceback" not in done.stderr


def test_a_reservation_the_api_refuses_prints_its_message(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    done = run(
        "lease", "create", "x", "--end", END, "--reservation",
        "resource_type=virtual:instance,amount=0,vcpus=1,memory_mb=1,disk_gb=0", *url, ok=False,
    )  # fmt: skip
    assert "error (400)" in done.stderr and "amount" in done.stderr
    unknown = run(
        "lease", "create", "y", "--end", END, "--reservation", "resource_type=x", *url, ok=False
    )
    assert "error (400)" in unknown.stderr and "resource_type" in unknown.stderr
    assert run_json("lease", "list", *url) == []


@pytest.mark.parametrize(
    ("text", "body"),
    [
        (
            'resource_type=virtual:floatingip,network_id=42,amount=2,required_floatingips=["1.2.3.4","1.2.3.5"]',
            {
                "resource_type": "virtual:floatingip",
                "network_id": 42,
                "amount": 2,
                "required_floatingips": ["1.2.3.4", "1.2.3.5"],
            },
        ),
        (
            'resource_type=virtual:instance,affinity=None,resource_properties=["and", '
            '["==", "$a", "1,2"], [">=", "$b", 2]],x=null,y=false,z="quoted, text"',
            {
                "resource_type": "virtual:instance",
                "affinity": "None",
                "resource_properties": ["and", ["==", "$a", "1,2"], [">=", "$b", 2]],
                "x": None,
                "y": False,
                "z": "quoted, text",
            },
        ),
        (
            "resource_type=device, min = 1 ,max=1.5",
            {"resource_type": "device", "min": 1, "max": 1.5},
        ),
        ("resource_type=a=b,pool=0042", {"resource_type": "a=b", "pool": "0042"}),
    ],
)
def test_reservation_values_that_read_as_json_are_sent_as_json(
    text: str, body: dict[str, Any]
) -> None:
    from climate.cli.reservation_args import parse_reservation

    assert parse_reservation(text) == body
    assert json.loads(json.dumps(parse_reservation(text))) == body


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("600", 600),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("01:30", 5400),
        ("1h30m", 5400),
        ("1d 2h", 93600),
        ("45s", 45),
        ("PT2H", 7200),
        ("p1dt12h", 129600),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    from climate.cli.durations import seconds as parse

    assert parse(text) == seconds


def test_human_durations_where_a_duration_is_asked(live_sqlite: LiveServer) -> None:
    url = ("--url", live_sqlite.url)
    run("host", "create", "compute-0", *url)
    latest = fmt(T0 + dt.timedelta(days=3))
    flexible = lease(
        url, "flex", "--duration", "2h", "--earliest-start", START, "--latest-end", latest
    )
    length = dt.datetime.fromisoformat(flexible["end_date"]) - dt.datetime.fromisoformat(
        flexible["start_date"]
    )
    assert length == dt.timedelta(hours=2)
    windows = run_json("availability", "search", "--duration", "1h30m", "--end", latest, *url)
    first = windows[0]
    assert dt.datetime.fromisoformat(first["end_date"]) - dt.datetime.fromisoformat(
        first["start_date"]
    ) >= dt.timedelta(minutes=90)
    series = run_json(
        "series", "create", "weekly", "--start", END, "--duration", "30m",
        "--rrule", "FREQ=WEEKLY;COUNT=2", "--reminder", "10m", *url,
    )["series"]  # fmt: skip
    assert (series["duration"], series["reminders"]) == (1800, ["PT10M"])
    for command in (
        ("lease", "create", "x", "--latest-end", latest, "--duration"),
        ("availability", "search", "--end", latest, "--duration"),
        ("series", "create", "y", "--start", END, "--rrule", "COUNT=1", "--duration"),
        ("lease", "create", "z", "--end", END, "--hold"),
    ):
        for bad in ("2 hours", "0", "-1h", "1h2d"):
            done = run(*command[:-1], f"{command[-1]}={bad}", *url, ok=False)
            assert f"argument {command[-1]}: must be a duration above zero" in done.stderr
            assert repr(bad) in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "reservations",
    [
        [{"resource_type": "physical:host", "min": 1, "max": 2, "hypervisor_properties": "",
          "resource_properties": '["==", "$gpu", "a,100"]', "before_end": "default"}],
        [{"resource_type": "physical:host", "min": 1, "max": 1, "before_end": "snapshot"}],
        [{"resource_type": "virtual:instance", "amount": 2, "vcpus": 2, "affinity": None,
          "resource_properties": "", "name": " spaced, \"quoted\" ", "flavor": "42"},
         {"resource_type": "virtual:floatingip", "network_id": "ext-net",
          "required_floatingips": ["172.24.4.10"], "amount": 1, "flag": "true"}],
    ],
)  # fmt: skip
def test_offered_reservations_read_back_as_the_same_options(
    reservations: list[dict[str, Any]],
) -> None:
    from climate.cli.reservation_args import parse_reservation, reservation_options

    words = shlex.split(reservation_options(reservations))
    if words[0] == "--min":
        (host,) = reservations
        assert words == ["--min", "1", "--max", "2", "--properties", host["resource_properties"]]
        return
    assert words[::2] == ["--reservation"] * len(reservations)
    assert [parse_reservation(w) for w in words[1::2]] == reservations


def test_a_segment_is_named_with_its_physical_network(live_sqlite: LiveServer) -> None:
    """Segment 100 of physnet1 and segment 100 of physnet2 are two segments: the calendar's rows
    and a lease's holdings name each as NETWORK/SEGMENT, never by the segment id alone."""
    url = ("--url", live_sqlite.url)
    for physnet in ("physnet1", "physnet2"):
        run(
            "network",
            "create",
            "100",
            "--network-type",
            "vlan",
            "--physical-network",
            physnet,
            *url,
        )
    held = lease(
        url,
        "vlan",
        "--start", START,
        "--end", END,
        "--reservation",
        'resource_type=network,amount=1,network_properties=["==","$physical_network","physnet2"]',
    )  # fmt: skip
    shown = run("lease", "show", held["id"], *url).stdout
    assert "physnet2/100" in shown and "physnet1/100" not in shown
    window = ("--start", START[:10], "--days", "3", "--resource-type", "network", *url)
    chart = run("calendar", *window, "--width", "120").stdout
    assert "segment physnet1/100" in chart and "segment physnet2/100" in chart
    rows = {r["name"]: r for r in run_json("calendar", *window)["resources"]}
    assert [a["lease_id"] for a in rows["physnet2/100"]["allocations"]] == [held["id"]]
    assert rows["physnet1/100"]["allocations"] == []
