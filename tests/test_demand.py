"""``GET /v1/demand`` over a seeded day computed by hand: refused demand per properties and
bucket beside utilisation, whether offers were taken, how many more hosts would have admitted
a share of it; CSV; bad input naming the field; who sees what; ``climate demand``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import httpx

from tests.conftest import LiveServer
from tests.test_cli import run

ALICE = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
BOB = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}
GPU = '["==", "$gpu", "a100"]'
RACK = '["==", "$rack", "r1"]'
DAY = {"start": "2031-03-01 00:00", "end": "2031-03-03 00:00"}


def lease(
    url: str, who: dict[str, str], name: str, hours: tuple[int, int], count: int, query: str
) -> httpx.Response:
    body = {
        "name": name,
        "start_date": f"2031-03-01 {hours[0]:02}:00",
        "end_date": f"2031-03-01 {hours[1]:02}:00",
        "reservations": [
            {
                "resource_type": "physical:host",
                "min": count,
                "max": count,
                "resource_properties": query,
            }
        ],
        "events": [],
    }
    return httpx.post(f"{url}/v1/leases", json=body, headers=who)


def seed(url: str) -> None:
    """Two GPU hosts and a plain one; A holds both GPUs 09-17, E the plain host 09-10.
    Refused: B (alice, 1 GPU 10-12), C (bob, 2 GPUs 13-15), D (alice, 3 GPUs 20-22: only two
    match), F (bob, the plain host 09-10). Alice then takes B's offer (1 GPU 17-19)."""
    for name, props in (("gpu-1", "gpu"), ("gpu-2", "gpu"), ("plain-1", "rack")):
        value = "a100" if props == "gpu" else "r1"
        made = httpx.post(f"{url}/v1/os-hosts", json={"name": name, props: value})
        assert made.status_code == 201, made.text
    assert lease(url, ALICE, "a", (9, 17), 2, GPU).status_code == 201
    assert lease(url, BOB, "e", (9, 10), 1, RACK).status_code == 201
    for who, name, hours, count, query in (
        (ALICE, "b", (10, 12), 1, GPU),
        (BOB, "c", (13, 15), 2, GPU),
        (ALICE, "d", (20, 22), 3, GPU),
        (BOB, "f", (9, 10), 1, RACK),
    ):
        assert lease(url, who, name, hours, count, query).status_code == 409, name
    assert lease(url, ALICE, "b2", (17, 19), 1, GPU).status_code == 201


def demand(url: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
    answer = httpx.get(f"{url}/v1/demand", params={**DAY, **params}, headers=headers or {})
    assert answer.status_code == 200, answer.text
    return answer.json()["demand"]


def test_a_seeded_day_by_hand(live: LiveServer) -> None:
    url = live.url
    seed(url)
    found = demand(url)
    groups = {(g["resource_type"], g["properties"]): g["buckets"] for g in found["groups"]}
    figures = {
        key: [
            (
                b["refused_requests"],
                b["refused_unit_hours"],
                b["reserved_hours"],
                b["capacity_hours"],
            )
            for b in buckets
        ]
        for key, buckets in groups.items()
    }
    assert figures == {
        # B 1x2 h + C 2x2 h + D 3x2 h = 12 unit-hours; A 2x8 h + b2 2 h reserved of 2x24 h.
        ("physical:host", GPU): [
            (3, "12.000000", "18.000000", "48.000000"),
            (0, "0.000000", "0.000000", "48.000000"),
        ],
        # F 1 h; E 1 h reserved of plain-1's 24 h.
        ("physical:host", RACK): [
            (1, "1.000000", "1.000000", "24.000000"),
            (0, "0.000000", "0.000000", "24.000000"),
        ],
    }
    refusals = {r["lease_name"]: r for r in found["refusals"]}
    assert set(refusals) == {"b", "c", "d", "f"}
    assert {n: r["reason"] for n, r in refusals.items()} == {
        "b": "too_few_free",
        "c": "too_few_free",
        "d": "too_few_match",
        "f": "too_few_free",
    }
    assert refusals["b"]["offer"]["start"] == "2031-03-01T17:00:00+00:00"
    # d's best offer is below its request (2 of the 3 hosts it asked for).
    assert {k: refusals["d"]["offer"][k] for k in ("kind", "min", "max")} == {
        "kind": "fewer_hosts",
        "min": 2,
        "max": 2,
    }
    # b's offer was taken by alice; c's (the same window) not: bob made no lease.
    assert {n: r["offer_taken"] for n, r in refusals.items()} == {
        "b": True,
        "c": False,
        "d": False,
        "f": False,
    }
    assert found["plan"] is None

    # Replay (GPU copies of gpu-1); 66% of 3 needs 2 requests, 67% needs 3. k=0 admits none;
    # k=1: B on the copy, C (2 hosts 13-15) not, D on gpu-1, gpu-2 and the copy: 2 of 3;
    # k=2: all 3. F does not match a GPU host.
    for target, extra, admitted in ((50, 1, 2), (66, 1, 2), (67, 2, 3), (100, 2, 3)):
        plan = demand(url, resource_type="physical:host", properties=GPU, target=target)["plan"]
        assert plan == {
            "resource_type": "physical:host",
            "properties": GPU,
            "template_host": "gpu-1",
            "target_percent": target,
            "measure": "requests",
            "replayed_requests": 4,
            "counted_requests": 3,
            "needed_requests": -(-target * 3 // 100),
            "extra_hosts": extra,
            "admitted_requests": admitted,
            "admitted_without_extra": 0,
        }, target

    hourly = demand(url, bucket="hour", start="2031-03-01 00:00", end="2031-03-02 00:00")
    gpu_hours = {(g["properties"]): g["buckets"] for g in hourly["groups"]}[GPU]
    assert len(gpu_hours) == 24
    ten = gpu_hours[10]
    assert (ten["start"], ten["refused_requests"], ten["refused_unit_hours"]) == (
        "2031-03-01T10:00:00+00:00",
        1,
        "1.000000",
    )
    assert (ten["reserved_hours"], ten["capacity_hours"]) == ("2.000000", "2.000000")

    shown = httpx.get(f"{url}/v1/demand", params={**DAY, "format": "csv"})
    assert shown.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(shown.text)))
    assert [(r["properties"], r["bucket_start"][:10], r["refused_requests"]) for r in rows] == [
        (GPU, "2031-03-01", "3"),
        (GPU, "2031-03-02", "0"),
        (RACK, "2031-03-01", "1"),
        (RACK, "2031-03-02", "0"),
    ]

    # Members see their own project's demand only; another's is a 403.
    mine = demand(url, headers=ALICE)
    assert {r["lease_name"] for r in mine["refusals"]} == {"b", "d"}
    other = httpx.get(f"{url}/v1/demand", params={**DAY, "project_id": "project-b"}, headers=ALICE)
    assert other.status_code == 403
    bobs = demand(url, project_id="project-b")
    assert {r["lease_name"] for r in bobs["refusals"]} == {"c", "f"}


def test_bad_input_is_a_400_naming_the_field(live: LiveServer) -> None:
    url = live.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1", "gpu": "a100"}).status_code == 201
    for params, field in (
        ({"period": "year"}, "period"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2030-01-02", "end": "2030-01-01"}, "end"),
        ({"start": "2030-01-01", "end": "2032-01-01"}, "end"),
        ({"period": "day", "end": "2030-01-01"}, "end"),
        ({"format": "xml"}, "format"),
        ({"bucket": "week"}, "bucket"),
        ({"bucket": "hour", "start": "2030-01-01", "end": "2030-03-01"}, "bucket"),
        ({"resource_type": "physical:hots"}, "resource_type"),
        ({"target": "many"}, "target"),
        ({"target": "0"}, "target"),
        ({"target": "101"}, "target"),
        ({"properties": GPU}, "target"),
        ({"target": "50", "resource_type": "virtual:volume"}, "resource_type"),
        ({"target": "50", "properties": '["==", "$gpu"'}, "properties"),
        ({"target": "50", "properties": '["==", "$gpu", "h100"]'}, "properties"),
    ):
        bad = httpx.get(f"{url}/v1/demand", params=params)
        assert bad.status_code == 400, (params, bad.text)
        assert bad.json()["error_message"].startswith(f"{field}:"), (params, bad.text)


def test_climate_demand_command(live_sqlite: LiveServer) -> None:
    url = live_sqlite.url
    seed(url)
    period = ["--start", DAY["start"], "--end", DAY["end"]]
    shown = run("demand", "--url", url, *period).stdout
    assert "physical:host" in shown and "12.000000" in shown
    as_json = json.loads(run("demand", "--url", url, *period, "-f", "json").stdout)
    assert {r["lease_name"] for r in as_json["refusals"]} == {"b", "c", "d", "f"}
    planned = run("demand", "--url", url, *period, "--properties", GPU, "--target", "100").stdout
    assert "100% of the 3 refused request(s) hosts like gpu-1 could serve (3): " in planned
    assert "extra hosts: 2 (admits 3; with none, 0)" in planned
    rows = list(csv.DictReader(io.StringIO(run("demand", "--url", url, *period, "--csv").stdout)))
    assert len(rows) == 4
    refused = run("demand", "--url", url, "--start", "2030-01-02", "--end", "2030-01-01", ok=False)
    assert "end: must be after start" in refused.stderr
