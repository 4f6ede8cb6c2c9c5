"""Refused demand is recorded at every step that refuses (create, update, series occurrences,
queue timeouts and give-ups, lapsed holds), after the refusal rolled back, never failing it;
dry runs are not recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select

from climate.config import Settings
from climate.db import demand as demand_rows
from climate.db.engine import Database
from climate.db.records import RefusedDemand
from climate.domain.admission import AdmissionRefused
from climate.domain.clock import ManualClock
from climate.domain.requests import (
    Conflicts,
    LeaseChanges,
    LeaseRequest,
    ReservationRequest,
    SeriesRequest,
)
from climate.domain.status import LeaseType
from climate.errors import UsageRuleBroken
from climate.runtime import build_context, build_workers
from climate.services.context import ServiceContext
from climate.services.demand import DemandService, Question
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.series import SeriesService
from climate.services.usage import window
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import add_hosts, host_request
from tests.test_flexible import flexible

HOUR = dt.timedelta(hours=1)


def recorded(ctx: ServiceContext) -> list[RefusedDemand]:
    with ctx.db.reader() as session:
        return list(session.scalars(select(RefusedDemand).order_by(RefusedDemand.id)))


@pytest.fixture
def one_host(hosts: HostService, leases: LeaseService) -> None:
    add_hosts(hosts, 1)
    leases.create(BOB, host_request("occupant", T0 + HOUR, T0 + 3 * HOUR))


def test_a_refused_creation_is_recorded_with_its_reason_and_best_offer(
    ctx: ServiceContext, leases: LeaseService, one_host: None
) -> None:
    with pytest.raises(AdmissionRefused):
        leases.create(ALICE, host_request("late", T0 + 2 * HOUR, T0 + 4 * HOUR))
    dry = dataclasses.replace(host_request("probe", T0 + 2 * HOUR, T0 + 4 * HOUR), dry_run=True)
    with pytest.raises(AdmissionRefused):
        leases.create(ALICE, dry)  # a probe: not recorded
    [row] = recorded(ctx)
    assert (row.project_id, row.user_id, row.lease_name, row.lease_id) == (
        "project-a",
        "alice",
        "late",
        None,
    )
    assert (row.step, row.outcome, row.reason) == ("create", "refused", "too_few_free")
    assert (row.resource_type, row.count_min, row.count_max) == ("physical:host", 1, 1)
    assert (row.start_date, row.end_date, row.at) == (T0 + 2 * HOUR, T0 + 4 * HOUR, T0)
    assert row.offer == {
        "kind": "later_start",
        "start": (T0 + 3 * HOUR).isoformat(),
        "end": (T0 + 5 * HOUR).isoformat(),
        "min": 1,
        "max": 1,
    }


def test_a_refused_update_and_series_occurrences_are_recorded(
    ctx: ServiceContext, leases: LeaseService, one_host: None
) -> None:
    mine = leases.create(ALICE, host_request("mine", T0 + 4 * HOUR, T0 + 5 * HOUR))
    with pytest.raises(AdmissionRefused):
        leases.update(ALICE, mine.id, LeaseChanges(start=T0 + 2 * HOUR, end=T0 + 5 * HOUR))
    host = ReservationRequest("physical:host", {"min": 1, "max": 1})
    series = SeriesRequest(
        name="daily",
        start=T0 + 2 * HOUR,
        duration=HOUR,
        rrule="FREQ=DAILY;COUNT=2",
        exdates=[],
        reservations=[host],
        conflicts=Conflicts.SKIP,
    )
    SeriesService(ctx, leases).create(ALICE, series)  # the first occurrence is skipped
    update, occurrence = recorded(ctx)
    assert (update.step, update.lease_id, update.lease_name) == ("update", mine.id, "mine")
    assert (update.start_date, update.end_date) == (T0 + 2 * HOUR, T0 + 5 * HOUR)
    assert update.offer is not None
    asked = window(None, T0, T0 + 24 * HOUR, T0, 400)
    [before] = [
        a
        for a in DemandService(ctx).report(ADMIN, asked, Question()).refusals
        if a.row.id == update.id
    ]
    assert before.taken is False
    offered = LeaseChanges(
        start=dt.datetime.fromisoformat(update.offer["start"]),
        end=dt.datetime.fromisoformat(update.offer["end"]),
    )
    leases.update(ALICE, mine.id, offered)  # the offer taken: the report says so
    [after] = [
        a
        for a in DemandService(ctx).report(ADMIN, asked, Question()).refusals
        if a.row.id == update.id
    ]
    assert after.taken is True
    assert (occurrence.step, occurrence.reason) == ("series", "too_few_free")
    assert occurrence.start_date == T0 + 2 * HOUR


def test_queue_timeouts_give_ups_and_lapsed_holds_are_recorded(
    ctx: ServiceContext, leases: LeaseService, hosts: HostService, clock: ManualClock
) -> None:
    add_hosts(hosts, 1)
    leases.create(BOB, host_request("occupant", None, T0 + 5 * HOUR))
    hunt = dataclasses.replace(
        host_request("hunt", None, T0 + HOUR), lease_type=LeaseType.BEST_EFFORT, deadline=T0 + HOUR
    )
    retry = dataclasses.replace(
        host_request("retry", None, T0 + HOUR), lease_type=LeaseType.RETRY, retries=1
    )
    leases.create(ALICE, hunt)
    leases.create(ALICE, retry)
    assert recorded(ctx) == []  # waiting is not refused yet
    manager = build_workers(ctx).manager
    clock.advance(2 * HOUR)
    manager.serve_queue()
    outcomes = {(r.lease_name, r.step, r.outcome, r.reason) for r in recorded(ctx)}
    assert outcomes == {
        ("hunt", "queue", "timed_out", "deadline"),
        ("retry", "queue", "gave_up", "attempts"),
    }
    held = dataclasses.replace(
        host_request("held", T0 + 6 * HOUR, T0 + 7 * HOUR), hold=dt.timedelta(minutes=10)
    )
    leases.create(ALICE, held)
    clock.advance(HOUR)
    manager.serve_queue()
    last = recorded(ctx)[-1]
    assert (last.lease_name, last.step, last.outcome, last.reason) == (
        "held",
        "hold",
        "abandoned",
        "hold_expired",
    )


def test_a_failure_to_record_never_turns_a_refusal_into_an_error(
    ctx: ServiceContext,
    leases: LeaseService,
    one_host: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(demand_rows, "add", broken)
    with pytest.raises(AdmissionRefused):
        leases.create(ALICE, host_request("late", T0 + 2 * HOUR, T0 + 4 * HOUR))
    assert "could not record 1 row(s) of refused demand" in caplog.text
    monkeypatch.undo()
    assert recorded(ctx) == []


def test_a_usage_rule_refusal_is_recorded_with_its_reason(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    rule = {"name": "mine", "kind": "concurrent", "unit": "hosts", "limit": 1}
    ctx = build_context(settings.model_copy(update={"usage_rules": (rule,)}), db, clock)
    add_hosts(hosts, 2)
    leases = LeaseService(ctx)
    leases.create(ALICE, host_request("first", T0 + HOUR, T0 + 2 * HOUR))
    with pytest.raises(UsageRuleBroken):
        leases.create(ALICE, host_request("second", T0 + HOUR, T0 + 2 * HOUR))
    [row] = recorded(ctx)
    assert (row.lease_name, row.step, row.outcome, row.reason, row.offer) == (
        "second",
        "create",
        "refused",
        "usage_rule",
        None,
    )
    assert row.message.startswith("usage rule 'mine'")


def test_an_update_a_usage_rule_refused_is_recorded_with_its_reason(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    rule = {"name": "short", "kind": "max_length", "limit": "2h"}
    ctx = build_context(settings.model_copy(update={"usage_rules": (rule,)}), db, clock)
    add_hosts(hosts, 1)
    leases = LeaseService(ctx)
    mine = leases.create(ALICE, host_request("mine", T0 + HOUR, T0 + 2 * HOUR))
    with pytest.raises(UsageRuleBroken):
        leases.update(ALICE, mine.id, LeaseChanges(end=T0 + 4 * HOUR))
    [row] = recorded(ctx)
    assert (row.lease_id, row.lease_name, row.step, row.outcome, row.reason) == (
        mine.id,
        "mine",
        "update",
        "refused",
        "usage_rule",
    )
    assert (row.start_date, row.end_date, row.resource_type) == (
        T0 + HOUR,
        T0 + 4 * HOUR,
        "physical:host",
    )
    assert row.message.startswith("usage rule 'short'")


def test_a_flexible_window_is_recorded_once_when_nothing_fits_and_not_when_raced(
    ctx: ServiceContext, leases: LeaseService, one_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(AdmissionRefused):
        leases.create(ALICE, flexible("none", T0 + HOUR, T0 + 3 * HOUR, 2 * HOUR))
    [row] = recorded(ctx)
    assert (row.lease_name, row.start_date, row.end_date) == ("none", T0 + HOUR, T0 + 3 * HOUR)
    create = leases.create
    raced: list[bool] = []

    def bob_first(actor: Any, request: LeaseRequest) -> Any:
        """Bob takes the chosen window between Alice's search and her admission, once."""
        if request.duration is None and not raced:
            raced.append(True)
            create(BOB, host_request("bob-2", request.start, request.end))
        return create(actor, request)

    monkeypatch.setattr(leases, "create", bob_first)
    lease = leases.create(ALICE, flexible("raced", T0, T0 + 10 * HOUR, HOUR))
    assert raced and lease.start_date == T0 + 3 * HOUR  # bob took 12:00, the occupant 13-15
    assert [r.lease_name for r in recorded(ctx)] == ["none"]  # the raced try is not demand
