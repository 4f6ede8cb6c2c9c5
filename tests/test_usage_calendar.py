"""An admission's usage rules read what a project holds of whole hosts from the hosts' calendar
(``CalendarCache.held``) instead of the range scan of ``db/usage.held``: after any mix of
creations, extensions, starts, early ends and deletions, by several users of two projects, the
calendar gives the rows the statement gives, in the admission's own transaction."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.orm import Session

from climate.backends.standalone import StandaloneBackend
from climate.config import Settings
from climate.db import usage
from climate.db.calendar_cache import CalendarCache, Owned
from climate.db.engine import ADMISSION_LOCK, Database
from climate.db.tables import HostAllocation
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.errors import ClimateError
from climate.fairshare import consumption
from climate.fairshare.rules import HOSTS
from climate.manager.service import Manager
from climate.planner.calendar import moment
from climate.resources.capabilities import WholeHosts
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ALICE, BOB, T0
from tests.helpers import add_hosts, host_request

CAROL = Actor("carol", ALICE.project_id, frozenset({"member"}))
ACTORS = (ALICE, BOB, CAROL)
H = dt.timedelta(hours=1)
RULES: tuple[dict[str, Any], ...] = (
    {"name": "hosts", "kind": "concurrent", "unit": "hosts", "limit": 100},
    {"name": "days", "kind": "budget", "unit": "hosts", "per": "project", "limit": 10**6}
    | {"window": "2d"},
    {"name": "stacking", "kind": "stacking", "limit": 1000, "gap": "1h", "window": "1d"},
)

Row = tuple[str, str, int, float, float, bool]


def _from_calendar(rows: list[Owned]) -> list[Row]:
    return sorted(
        (lid, user, host, round(s, 3), round(e, 3), own) for lid, user, host, s, e, own in rows
    )


def _from_database(rows: list[usage.Held]) -> list[Row]:
    """The statement's rows but those that held nothing (cut at their start), which the
    calendar never holds and the rules never count (``consumption.spans``)."""
    return sorted(
        (lid, user, host, round(s, 3), round(e, 3), own)
        for kind, lid, user, host, s, e, amount, own in rows
        if kind == HOSTS and amount == 0 and s < e
    )


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every answer the calendar gives is checked against the statement, in its transaction;
    returns how many rows each checked answer had."""
    checked: list[int] = []
    real = CalendarCache.held

    def both(
        self: CalendarCache,
        session: Session,
        project_id: str,
        user_id: str,
        mine: tuple[float, float],
        ours: tuple[float, float] | None,
        lease: tuple[str, str, str] | None = None,
    ) -> list[Owned] | None:
        found = real(self, session, project_id, user_id, mine, ours, lease)
        if found is not None:
            bounds = None if ours is None else (moment(ours[0]), moment(ours[1]))
            read = usage.held(
                session, project_id, user_id, (moment(mine[0]), moment(mine[1])), bounds, {HOSTS}
            )
            assert _from_calendar(found) == _from_database(read)
            checked.append(len(found))
        return found

    monkeypatch.setattr(CalendarCache, "held", both)
    return checked


Step = tuple[str, int, int, int]
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "create", "extend", "delete", "advance"]),
        st.integers(0, 2),  # who, or which lease
        st.integers(0, 48),  # hours ahead, or by how much
        st.integers(1, 3),  # hosts, or hours long x 4
    ),
    min_size=1,
    max_size=14,
)


def _play(settings_: Settings, db: Database, steps: list[Step]) -> None:
    clock = ManualClock(T0)
    ctx = build_context(settings_.model_copy(update={"usage_rules": RULES}), db, clock)
    add_hosts(HostService(ctx), 4)
    leases = LeaseService(ctx)
    manager = Manager(ctx, StandaloneBackend(), name="manager-1")
    made: list[tuple[Actor, str]] = []
    for kind, who, hours, size in steps:
        now = clock.now()
        try:
            if kind == "create":
                start = now + hours * H
                asked = host_request(f"l{len(made)}", start, start + 4 * size * H, size)
                made.append((ACTORS[who], leases.create(ACTORS[who], asked).id))
            elif kind == "extend" and made:
                actor, lease_id = made[who % len(made)]
                end = leases.get(actor, lease_id).end_date + (hours + 1) * H
                leases.update(actor, lease_id, LeaseChanges(end=end))
            elif kind == "delete" and made:
                actor, lease_id = made.pop(who % len(made))
                leases.delete(actor, lease_id)
            elif kind == "advance":
                clock.set(now + (hours + 1) * H / 4)
                manager.run_due()
        except ClimateError:
            pass  # refused: what the calendar holds is still compared by the next admission
    last = host_request("last", clock.now() + H, clock.now() + 2 * H)
    for actor in ACTORS:
        try:
            leases.create(actor, last)
        except ClimateError:
            pass


@pytest.fixture
def sqlite_copies(sqlite_template: Path, tmp_path: Path) -> Iterator[Iterator[str]]:
    def copies() -> Iterator[str]:
        for i in range(10**6):
            path = tmp_path / f"held-{i}.db"
            shutil.copy(sqlite_template, path)
            yield f"sqlite:///{path}"

    yield copies()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_the_calendar_reads_what_the_statement_reads(
    settings: Settings, sqlite_copies: Iterator[str], compared: list[int], steps: list[Step]
) -> None:
    db = Database(next(sqlite_copies))
    try:
        _play(settings, db, steps)
    finally:
        db.dispose()
    assert compared  # the last admissions at least were judged from the calendar


def test_on_both_databases_with_history_starts_and_ends(
    settings: Settings, db: Database, compared: list[int]
) -> None:
    steps: list[Step] = [
        ("create", 0, 0, 1),  # starting now,
        ("delete", 0, 0, 0),  # deleted as it begins: its allocation holds nothing
        ("create", 0, 1, 1),
        ("create", 1, 2, 2),
        ("create", 2, 0, 1),
        ("advance", 0, 7, 0),  # the first lease starts
        ("extend", 0, 3, 0),
        ("create", 0, 10, 3),
        ("advance", 0, 40, 0),  # some end
        ("delete", 1, 0, 0),
        ("create", 2, 1, 1),
        ("extend", 1, 2, 0),
    ]
    _play(settings, db, steps)
    assert max(compared) >= 3  # not only empty answers


def test_a_range_before_what_the_calendar_loaded_reads_the_database(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    ctx = build_context(settings.model_copy(update={"usage_rules": RULES}), db, clock)
    add_hosts(hosts, 1)
    LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    calendar = cast(WholeHosts, ctx.resource_types[HOSTS]).calendar
    with db.transaction() as session:
        db.lock(session, ADMISSION_LOCK)
        calendar.sync(session)  # as an admission does, exclusively
        reach = (T0 + H).timestamp(), (T0 + 2 * H).timestamp()
        found = calendar.held(session, ALICE.project_id, ALICE.user_id, reach, None)
        assert found is not None and len(found) == 1
        long_ago = (dt.datetime(2000, 1, 1, tzinfo=dt.UTC).timestamp(), reach[1])
        assert calendar.held(session, ALICE.project_id, ALICE.user_id, long_ago, None) is None
    with db.transaction() as session:  # not synced under the admission lock
        assert calendar.held(session, ALICE.project_id, ALICE.user_id, reach, None) is None


def test_a_reservation_emptied_then_rolled_back_is_read_again(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    """Read while a transaction had taken its hosts away (and dropped from the project's
    reservations then), a reservation that gets them back on rollback is read again."""
    ctx = build_context(settings.model_copy(update={"usage_rules": RULES}), db, clock)
    add_hosts(hosts, 1)
    lease = LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    (reservation,) = lease.reservations
    calendar = cast(WholeHosts, ctx.resource_types[HOSTS]).calendar
    reach = (T0 + H).timestamp(), (T0 + 2 * H).timestamp()

    def held() -> list[Owned] | None:
        return calendar.held(session, ALICE.project_id, ALICE.user_id, reach, reach)

    with pytest.raises(RuntimeError), db.transaction() as session:
        db.lock(session, ADMISSION_LOCK)
        calendar.replace(session, reservation.id, lease.id, [], T0 + H, T0 + 2 * H)
        assert held() == []
        raise RuntimeError("rolled back")
    with db.transaction() as session:
        db.lock(session, ADMISSION_LOCK)
        calendar.sync(session)
        found = held()
        assert found is not None and len(found) == 2  # as the user's and as the project's


def test_an_allocation_that_held_nothing_is_not_counted_from_the_database(
    settings: Settings, db: Database, clock: ManualClock, hosts: HostService
) -> None:
    """A row cut at its very start (kept so by SQLite before migration 0022) is read by the
    statement but counted by no rule, as the calendar never holds it."""
    ctx = build_context(settings.model_copy(update={"usage_rules": RULES}), db, clock)
    add_hosts(hosts, 1)
    LeaseService(ctx).create(ALICE, host_request("l", T0 + H, T0 + 2 * H))
    with db.transaction() as session:
        session.execute(update(HostAllocation).values(end_date=HostAllocation.start_date))
    reach = T0.timestamp(), (T0 + 3 * H).timestamp()
    with db.transaction() as session:  # a reader's: from the database
        bounds = (T0, T0 + 3 * H)
        assert len(usage.held(session, ALICE.project_id, ALICE.user_id, bounds, None, {HOSTS})) == 1
        users, project = consumption.spans(
            ctx, session, ALICE.project_id, ALICE.user_id, reach, reach, frozenset({HOSTS})
        )
    assert (users, project) == ([], [])
