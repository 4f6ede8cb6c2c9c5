"""Usage rules over HTTP: the 403 body, dry runs, and ``GET /v1/policy/usage``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from climate import wire
from climate.config import Settings
from tests.conftest import LiveServer, serve

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
RULES = (
    {"name": "short", "kind": "max_length", "limit": "4h"},
    {"name": "two-hosts", "kind": "concurrent", "unit": "hosts", "limit": 2},
    {
        "name": "gpu-days",
        "kind": "budget",
        "unit": "gpus",
        "limit": 0.5,
        "window": "7d",
        "properties": '["==", "$gpu", "a100"]',
    },
    {"name": "ops-free", "kind": "max_advance", "limit": "30d", "exempt_projects": ["project-a"]},
)


@pytest.fixture
def server(settings: Settings, sqlite_url: str) -> Iterator[LiveServer]:
    with serve(settings.model_copy(update={"usage_rules": RULES}), sqlite_url) as live:
        with httpx.Client(base_url=live.url, timeout=30) as admin:
            for i in range(3):
                body = {"name": f"gpu-{i}", "gpu": "a100", "gpu_count": "2"}
                assert admin.post("/v1/os-hosts", json=body).status_code == 201
        yield live


@pytest.fixture
def member(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=MEMBER, timeout=30) as http:
        yield http


def lease_body(name: str, start: dt.datetime, hours: float, hosts: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "start_date": wire.lease_date(start)[:16].replace("T", " "),
        "end_date": wire.lease_date(start + dt.timedelta(hours=hours))[:16].replace("T", " "),
        "reservations": [{"resource_type": "physical:host", "min": hosts, "max": hosts}],
        "events": [],
    }


def soon() -> dt.datetime:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    return now + dt.timedelta(hours=2)


def test_the_403_names_the_rule_its_limit_and_the_figure(member: httpx.Client) -> None:
    response = member.post("/v1/leases", json=lease_body("long", soon(), 5))
    assert response.status_code == 403
    body = response.json()
    assert body["error_name"] == 403  # Blazar sends the status again
    assert body["error_message"] == (
        "usage rule 'short' (max_length: a lease may last at most 4 hours): this lease lasts "
        "5 hours; breaks the limit"
    )
    [rule] = body["rules"]
    assert (rule["rule"], rule["limit"], rule["figure"], rule["unit"]) == (
        "short",
        14400,
        18000,
        "seconds",
    )
    assert member.get("/v1/leases").json()["leases"] == []


def test_a_dry_run_reports_every_broken_rule(member: httpx.Client) -> None:
    start = soon()
    response = member.post("/v1/leases?dry_run=true", json=lease_body("big", start, 3, hosts=3))
    assert response.status_code == 403
    names = [r["rule"] for r in response.json()["rules"]]
    assert names == ["two-hosts", "gpu-days"]
    assert "(and 1 more rule(s) broken)" in response.json()["error_message"]
    fits = member.post("/v1/leases?dry_run=true", json=lease_body("ok", start, 3, hosts=2))
    assert fits.status_code == 200, fits.text


def test_usage_shows_limits_and_consumption(member: httpx.Client, server: LiveServer) -> None:
    body = {**lease_body("now", dt.datetime.now(dt.UTC), 3), "start_date": "now"}
    created = member.post("/v1/leases", json=body)
    assert created.status_code == 201, created.text
    body = member.get("/v1/policy/usage").json()
    assert (body["project_id"], body["user_id"], body["external_service"]) == (
        "project-a",
        "alice",
        False,
    )
    rules = {r["rule"]: r for r in body["rules"]}
    assert rules["two-hosts"]["current"] == 1 and rules["two-hosts"]["ahead"] == 1
    assert rules["two-hosts"]["limit"] == 2 and rules["two-hosts"]["unit"] == "hosts"
    gpu = rules["gpu-days"]
    assert gpu["unit"] == "GPU-days" and gpu["limit"] == 0.5
    lease = created.json()["lease"]
    begin, end = (dt.datetime.fromisoformat(lease[k]) for k in ("start_date", "end_date"))
    # Two GPUs over the lease as made ("now" to an end given to the minute).
    assert gpu["current"] + gpu["ahead"] == pytest.approx(
        2 * (end - begin) / dt.timedelta(days=1), abs=1e-5
    )
    assert rules["short"]["current"] is None
    assert rules["ops-free"]["exempt"] is True
    other = member.get("/v1/policy/usage", params={"project_id": "project-b"})
    assert other.status_code == 403
    assert "project_id: only an admin" in other.json()["error_message"]
    with httpx.Client(base_url=server.url, timeout=30) as admin:
        seen = admin.get("/v1/policy/usage", params={"project_id": "project-a", "user_id": "alice"})
    assert {r["rule"]: r["current"] for r in seen.json()["rules"]}["two-hosts"] == 1
