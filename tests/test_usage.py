"""Usage and billing: reserved and really used host-hours of a hand-computed day, priced flat and
with a premium, to the cent; periods, formats, bad input and who sees what."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import httpx
import pytest

from climate.backends import load_backend
from climate.config import Settings, load_settings
from climate.db.engine import Database
from climate.domain.clock import ManualClock
from climate.errors import Forbidden, InvalidInput
from climate.manager.service import Manager
from climate.pricing import PriceTable
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.usage import UsageService, window
from tests.conftest import ADMIN, ALICE, BOB, LiveServer
from tests.helpers import host_request
from tests.test_cli import run

DAY = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PRICES = {"physical:host": "1.50", "physical:host[gpu=a100]": "4.00"}


def at(hours: float) -> dt.datetime:
    return DAY + dt.timedelta(hours=hours)


@pytest.fixture
def priced(settings: Settings) -> Settings:
    return settings.model_copy(update={"prices": PRICES})


def test_a_hand_computed_day_to_the_cent(priced: Settings, database_url: str) -> None:
    db = Database(database_url)
    clock = ManualClock(at(12))
    ctx = build_context(priced, db, clock)
    hosts, leases = HostService(ctx), LeaseService(ctx)
    hosts.create(ADMIN, "gpu-1", {"gpu": "a100"})
    hosts.create(ADMIN, "plain-1", {"rack": "r1"})
    gpu, plain = '["==", "$gpu", "a100"]', '["==", "$rack", "r1"]'
    # A: the GPU host 13:00-17:00, started 20 minutes late (the manager was away).
    leases.create(ALICE, host_request("a", at(13), at(17), resource_properties=gpu))
    # B: the plain host 14:00-22:00, deleted at 16:30.
    b = leases.create(ALICE, host_request("b", at(14), at(22), resource_properties=plain))
    # C: bob, the plain host 23:00 to 03:00 the next day, still running at 23:30.
    leases.create(BOB, host_request("c", at(23), at(27), resource_properties=plain))
    manager = Manager(ctx, load_backend(priced))
    for hour in (13 + 20 / 60, 14, 16.5, 17, 23, 23.5):
        clock.set(at(hour))
        if hour == 16.5:
            leases.delete(ALICE, b.id)
        manager.run_due()

    report = UsageService(ctx).report(ADMIN, window(None, at(0), at(24), clock.now(), 400))
    found = {
        (p.project_id, line.rule): (
            line.reserved.quantize(Decimal("0.000001")),
            line.used.quantize(Decimal("0.000001")),
            line.reserved_amount,
            line.used_amount,
        )
        for p in report.projects
        for line in p.lines
    }
    assert found == {
        # 4 h reserved x 4.00; 13:20-17:00 = 3 h 40 min used x 4.00 = 14.666... -> 14.67
        ("project-a", "physical:host[gpu=a100]"): (
            Decimal("4.000000"),
            Decimal("3.666667"),
            Decimal("16.00"),
            Decimal("14.67"),
        ),
        # 14:00-16:30, cut by the delete: 2.5 h x 1.50 both ways
        ("project-a", "physical:host"): (
            Decimal("2.500000"),
            Decimal("2.500000"),
            Decimal("3.75"),
            Decimal("3.75"),
        ),
        # 23:00-24:00 of the period reserved, 23:00-23:30 used so far
        ("project-b", "physical:host"): (
            Decimal("1.000000"),
            Decimal("0.500000"),
            Decimal("1.50"),
            Decimal("0.75"),
        ),
    }
    totals = {p.project_id: (p.reserved_amount, p.used_amount) for p in report.projects}
    assert totals == {
        "project-a": (Decimal("19.75"), Decimal("18.42")),
        "project-b": (Decimal("1.50"), Decimal("0.75")),
    }
    # A member sees their own project only, and may not ask for another.
    mine = UsageService(ctx).report(ALICE, window("day", at(5), None, clock.now(), 400))
    assert [p.project_id for p in mine.projects] == ["project-a"]
    with pytest.raises(Forbidden):
        UsageService(ctx).report(ALICE, window("day", at(5), None, clock.now(), 400), "project-b")
    db.dispose()


def test_periods_and_their_errors_name_the_field() -> None:
    now = dt.datetime(2030, 2, 14, 15, 30, tzinfo=dt.UTC)
    month = window(None, None, None, now, 400)
    assert (month.start, month.end, month.period) == (
        dt.datetime(2030, 2, 1, tzinfo=dt.UTC),
        dt.datetime(2030, 3, 1, tzinfo=dt.UTC),
        "month",
    )
    december = window("month", dt.datetime(2030, 12, 9, tzinfo=dt.UTC), None, now, 400)
    assert december.end == dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
    day = window("day", None, None, now, 400)
    assert (day.start, day.end) == (
        dt.datetime(2030, 2, 14, tzinfo=dt.UTC),
        dt.datetime(2030, 2, 15, tzinfo=dt.UTC),
    )
    cases = [
        (("week", None, None), "period"),
        (("day", None, now), "end"),
        ((None, now, None), "end"),
        ((None, None, now), "start"),
        ((None, now, now), "end"),
        ((None, now, now - dt.timedelta(hours=1)), "end"),
        ((None, now, now + dt.timedelta(days=401)), "end"),
    ]
    for (period, start, end), field in cases:
        with pytest.raises(InvalidInput) as refused:
            window(period, start, end, now, 400)
        assert refused.value.field == field


def test_the_price_table_refuses_bad_rules_by_name() -> None:
    for rules, where in (
        ({"physical:hots": "1"}, "prices.physical:hots"),
        ({"physical:host[gpu]": "1"}, "prices.physical:host[gpu]"),
        ({"physical:host": "one"}, "prices.physical:host"),
        ({"physical:host": "-1"}, "prices.physical:host"),
        ({"physical:host": "NaN"}, "prices.physical:host"),
        ({"physical:host": "1e30"}, "prices.physical:host"),
    ):
        with pytest.raises(InvalidInput) as refused:
            PriceTable.parse(rules)
        assert refused.value.field == where
    with pytest.raises(InvalidInput) as refused:
        load_settings(env={"CLIMATE_PRICES": '{"physical:host": "-2"}'})
    assert refused.value.message.startswith("CLIMATE_PRICES: prices.physical:host: ")
    table = PriceTable.parse(
        {"physical:host": "1", "physical:host[gpu=a100]": "4", "physical:host[ssd=yes]": "2"}
    )
    both = {"gpu": "a100", "ssd": "yes"}
    assert table.amount("physical:host", both, Decimal("1.5")) == Decimal("6.00")
    assert table.amount("physical:host", {"ssd": "yes"}, Decimal("1.5")) == Decimal("3.00")
    assert table.amount("physical:host", {}, Decimal("1.5")) == Decimal("1.50")
    assert table.amount("virtual:volume", {}, Decimal("100")) == Decimal("0.00")


MEMBER_B = {"X-Project-Id": "project-b", "X-User-Id": "bob", "X-Roles": "member"}


def test_usage_over_http_as_json_and_csv(live: LiveServer) -> None:
    url = live.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    lease = {
        "name": "now",
        "start_date": "now",
        "end_date": "2031-01-01 00:00",
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    assert httpx.post(f"{url}/v1/leases", json=lease, headers=MEMBER_B).status_code == 201
    answer = httpx.get(f"{url}/v1/usage", params={"period": "day"})
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["period"] == "day"
    [project] = usage["projects"]
    assert project["project_id"] == "project-b"
    [line] = project["lines"]
    assert (line["resource_type"], line["unit"], line["price_rule"]) == (
        "physical:host",
        "host-hours",
        "",
    )
    assert Decimal(line["reserved_hours"]) > 0 and line["reserved_amount"] == "0.00"
    for asked in ({"format": "csv"}, {}):
        headers = {} if asked else {"Accept": "text/csv"}
        shown = httpx.get(f"{url}/v1/usage", params=asked, headers=headers)
        assert shown.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(shown.text)))
        assert [(r["project_id"], r["resource_type"]) for r in rows] == [
            ("project-b", "physical:host")
        ]
    member = {"X-Project-Id": "project-a", "X-User-Id": "alice", "X-Roles": "member"}
    assert httpx.get(f"{url}/v1/usage", headers=member).json()["usage"]["projects"] == []
    refused = httpx.get(f"{url}/v1/usage", params={"project_id": "project-b"}, headers=member)
    assert refused.status_code == 403
    for params, field in (
        ({"period": "year"}, "period"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2030-01-02", "end": "2030-01-01"}, "end"),
        ({"start": "2030-01-01", "end": "2032-01-01"}, "end"),
        ({"format": "xml"}, "format"),
    ):
        bad = httpx.get(f"{url}/v1/usage", params=params)
        assert bad.status_code == 400, (params, bad.text)
        assert bad.json()["error_message"].startswith(f"{field}:"), bad.text


def test_climate_usage_command(live_sqlite: LiveServer) -> None:
    url = live_sqlite.url
    assert httpx.post(f"{url}/v1/os-hosts", json={"name": "h1"}).status_code == 201
    lease = {
        "name": "now",
        "start_date": "now",
        "end_date": "2031-01-01 00:00",
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1}],
        "events": [],
    }
    assert httpx.post(f"{url}/v1/leases", json=lease, headers=MEMBER_B).status_code == 201
    shown = run("usage", "--period", "day", "--url", url).stdout
    assert "project-b" in shown and "physical:host" in shown and "total" in shown
    as_json = json.loads(run("usage", "--url", url, "--json").stdout)
    assert as_json["period"] == "month"
    assert as_json["projects"][0]["project_id"] == "project-b"
    rows = list(csv.DictReader(io.StringIO(run("usage", "--url", url, "--csv").stdout)))
    assert [r["project_id"] for r in rows] == ["project-b"]
    refused = run("usage", "--url", url, "--start", "2030-01-02", "--end", "2030-01-01", ok=False)
    assert "end: must be after start" in refused.stderr


@pytest.mark.parametrize("route", ["/v1/usage", "/v1/demand", "/v1/policy/usage"])
@pytest.mark.parametrize("project", ["", " ", "a\x1bb"])
def test_a_report_for_a_blank_or_unprintable_project_is_a_400(
    live_sqlite: LiveServer, route: str, project: str
) -> None:
    bad = httpx.get(f"{live_sqlite.url}{route}", params={"project_id": project})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error_message"].startswith("project_id: "), bad.text


@pytest.mark.parametrize("user", ["", "a\x1bb"])
def test_usage_rules_for_a_blank_or_unprintable_user_is_a_400(
    live_sqlite: LiveServer, user: str
) -> None:
    bad = httpx.get(f"{live_sqlite.url}/v1/policy/usage", params={"user_id": user})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error_message"].startswith("user_id: "), bad.text
