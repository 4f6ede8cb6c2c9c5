"""The admission pipeline's plumbing: a refusal comes back as a value once its transaction has
rolled back, a dry run's transaction is rolled back without an exception, and a refused
update's search for its latest end stops at its budget."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from climate.context import ServiceContext
from climate.db import audit
from climate.db.records import AuditLog
from climate.domain.admission import Admitted, Refused, Reshape, Reshaped
from climate.domain.requests import LeaseChanges
from climate.errors import NotEnoughCapacity
from climate.planner.calendar import seconds
from climate.services.leases import offers
from climate.services.leases.admission import attempt
from tests.conftest import T0

HOUR = dt.timedelta(hours=1)


def records(ctx: ServiceContext) -> int:
    with ctx.db.reader() as session:
        return int(session.scalar(select(func.count()).select_from(AuditLog)) or 0)


def write_one(session: Session) -> str:
    audit.record(session, at=T0, actor="test", action="test.write", target_type="t", target_id="1")
    return "written"


def test_a_refusal_is_a_value_and_nothing_it_wrote_remains(ctx: ServiceContext) -> None:
    def refused(session: Session) -> str:
        write_one(session)
        raise NotEnoughCapacity("not enough hosts")

    before = records(ctx)
    assert attempt(ctx, refused) == Refused("not enough hosts")
    assert records(ctx) == before


def test_a_dry_run_is_admitted_and_rolled_back(ctx: ServiceContext) -> None:
    before = records(ctx)
    assert attempt(ctx, write_one, rollback=True) == Admitted("written")
    assert records(ctx) == before
    assert attempt(ctx, write_one) == Admitted("written")
    assert records(ctx) == before + 1


def test_the_latest_end_search_stops_at_its_budget() -> None:
    tried: list[LeaseChanges] = []

    def would_update(changes: LeaseChanges) -> bool:
        tried.append(changes)
        return True

    asked = Reshape(
        "lease",
        T0,
        T0 + HOUR,
        T0,
        T0 + 2 * HOUR,
        False,
        (Reshaped("r", "physical:host", {"min": 1, "max": 1}, None),),
    )
    ends = [seconds(T0 + HOUR + i * dt.timedelta(minutes=1)) for i in range(1, 10_000)]

    found = offers._latest_end(would_update, asked, LeaseChanges(), ends, 5)

    assert len(tried) == 5
    assert found is not None and found.changes.end == tried[-1].end
