"""Credits over HTTP and the CLI (docs/credits.md): the dry run's quote, the 403 with the
figures in Blazar's error shape, the balance and ledger routes, bad input named, and
``climate credits``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from climate.config import Settings
from tests.conftest import LiveServer, serve
from tests.test_cli import run

MEMBER = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
LEASE = {
    "name": "a",
    "start_date": "2031-01-01 10:00",
    "end_date": "2031-01-01 14:00",
    "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
    "events": [],
}


@pytest.fixture
def live(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    priced = settings.model_copy(update={"prices": {"physical:host": "1.25"}, "credits": True})
    with serve(priced, database_url) as server:
        yield server


def test_a_dry_run_quotes_what_creation_encumbers(live: LiveServer) -> None:
    url = live.url
    credits, ledger = f"{url}/v1/projects/project-a/credits", f"{url}/v1/projects/project-a/ledger"
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1", "su_factor": "2"}).is_success
    refused = httpx.post(f"{url}/v1/leases", json=LEASE, headers=MEMBER)
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert (body["error_code"], body["balance"], body["quote"], body["shortfall"]) == (
        403,
        "0.00",
        "10.00",
        "10.00",
    )
    assert body["rules"][0]["rule"] == "credits"
    assert "0.00" in body["error_message"] and "10.00" in body["error_message"]
    granted = httpx.post(credits, json={"amount": "25.5", "note": "course"})
    assert granted.status_code == 201, granted.text
    assert granted.json()["entry"]["balance"] == "25.50"
    dry = httpx.post(f"{url}/v1/leases", json=LEASE, headers=MEMBER, params={"dry_run": "true"})
    assert dry.status_code == 200 and dry.json()["quote"] == "10.00"
    created = httpx.post(f"{url}/v1/leases", json=LEASE, headers=MEMBER)
    assert created.status_code == 201, created.text
    shown = httpx.get(credits, headers=MEMBER).json()["credits"]
    assert shown == {
        "project_id": "project-a",
        "enabled": True,
        "balance": "15.50",
        "encumbered": "10.00",
    }
    entries = httpx.get(ledger, headers=MEMBER).json()["ledger"]
    assert [(e["kind"], e["amount"], e["balance"]) for e in entries] == [
        ("grant", "25.50", "25.50"),
        ("encumber", "-10.00", "15.50"),
    ]
    assert entries[1]["lease_id"] == created.json()["lease"]["id"]
    other = {**MEMBER, "X-Project-Id": "project-b"}
    assert httpx.get(ledger, headers=other).status_code == 403
    assert httpx.get(credits, headers=other).status_code == 403
    assert httpx.post(credits, json={"amount": "1"}, headers=MEMBER).status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": "1.001"}, "amount"),
        ({"amount": "ten"}, "amount"),
        ({"amount": 1.5}, "amount"),
        ({"amount": True}, "amount"),
        ({"amount": "NaN"}, "amount"),
        ({"amount": "1e999999"}, "amount"),
        ({"amount": 10**30}, "amount"),
        ({"amount": "0"}, "amount"),
        ({"amount": "1", "note": "x" * 256}, "note"),
        ({"amount": "1", "extra": 1}, "extra"),
        ({}, "amount"),
    ],
)
def test_bad_grants_are_400s_naming_the_field(
    live_sqlite: LiveServer, body: dict[str, object], field: str
) -> None:
    answer = httpx.post(f"{live_sqlite.url}/v1/projects/p/credits", json=body)
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["error_message"], answer.text


def test_a_whole_number_amount_is_allowed_as_far_as_a_string(live_sqlite: LiveServer) -> None:
    credits = f"{live_sqlite.url}/v1/projects/p/credits"
    granted = httpx.post(credits, json={"amount": 3_000_000_000})
    assert granted.status_code == 201, granted.text
    assert granted.json()["entry"]["balance"] == "3000000000.00"
    too_much = httpx.post(credits, json={"amount": 10**12 + 1})
    assert too_much.status_code == 400
    assert too_much.json()["error_message"] == "amount: must be at most 1000000000000 either way"


@pytest.mark.parametrize("project", ["%1b%5B2J", "%20", "x" * 256])
def test_credits_are_granted_only_to_a_project_id_that_can_be_one(
    live_sqlite: LiveServer, project: str
) -> None:
    url = live_sqlite.url
    answer = httpx.post(f"{url}/v1/projects/{project}/credits", json={"amount": "1"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_message"].startswith("project_id: ")
    assert httpx.get(f"{url}/v1/projects/{project}/ledger").json() == {"ledger": []}


def test_a_wild_factor_counts_one_and_a_quote_past_any_balance_is_refused(
    settings: Settings, sqlite_url: str
) -> None:
    dear = settings.model_copy(update={"prices": {"physical:host": "1000000000"}, "credits": True})
    with serve(dear, sqlite_url) as live:
        url = live.url
        for name, factor in (("wild", "1e30"), ("heavy", "1000000")):
            made = httpx.post(f"{url}/v1/os-hosts", json={"name": name, "su_factor": factor})
            assert made.status_code == 201, made.text
        wild = {
            **LEASE,
            "reservations": [
                {
                    "resource_type": "physical:host",
                    "min": 1,
                    "max": 1,
                    "hypervisor_properties": '["==", "$hypervisor_hostname", "wild"]',
                }
            ],
        }
        dry = httpx.post(f"{url}/v1/leases", json=wild, params={"dry_run": "true"})
        assert dry.status_code == 403, dry.text
        assert dry.json()["quote"] == "4000000000.00"
        heavy = {**wild, "end_date": "2031-01-06 10:00"}
        heavy["reservations"][0]["hypervisor_properties"] = (
            '["==", "$hypervisor_hostname", "heavy"]'
        )
        refused = httpx.post(f"{url}/v1/leases", json=heavy)
        assert refused.status_code == 403, refused.text
        assert refused.json()["quote"] == "120000000000000000.00"
        assert httpx.get(f"{url}/v1/projects/admin/ledger").json() == {"ledger": []}


def test_bad_ledger_queries_are_400s(live_sqlite: LiveServer) -> None:
    for params, field in (({"limit": "0"}, "limit"), ({"marker": "x"}, "marker")):
        answer = httpx.get(f"{live_sqlite.url}/v1/projects/p/ledger", params=params)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error_message"].startswith(f"{field}:")


def test_climate_credits_command(live_sqlite: LiveServer) -> None:
    url = live_sqlite.url
    granted = json.loads(
        run(
            "credits", "grant", "project-a", "12.30", "--note", "x", "--url", url, "-f", "json"
        ).stdout
    )
    assert (granted["kind"], granted["amount"], granted["note"]) == ("grant", "12.30", "x")
    shown = run(
        "credits", "balance", "--url", url, "--project", "project-a", "--roles", "member"
    ).stdout
    assert "12.30" in shown
    ledger = json.loads(run("credits", "ledger", "project-a", "--url", url, "-f", "json").stdout)
    assert [e["amount"] for e in ledger] == ["12.30"]
    table = run("credits", "ledger", "project-a", "--url", url).stdout
    assert "grant" in table and "12.30" in table
    refused = run("credits", "grant", "project-a", "-20", "--url", url, ok=False)
    assert "below zero" in refused.stderr
    nobody = run("credits", "balance", "--url", url, ok=False)
    assert "name the project" in nobody.stderr
