"""A listing process keeps the pages of leases it listed and brings them up to date from the
leases changed since (``db/lease_pages.py``): every page it answers must be the page read
afresh, whatever happened in between, for every order, filter, size and marker."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from climate.config import load_settings
from climate.context import Page
from climate.db import lease_pages, lease_views
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.domain.status import LeaseType
from climate.errors import ClimateError
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request, nothing_kept, world_on_copy

HOUR = dt.timedelta(hours=1)

Listed = list[tuple[str, int | None, int | None]]


def listed(leases: LeaseService, actor: Actor, page: Page, status: str | None) -> Listed:
    shown = leases.list_revised(actor, nothing_kept, status=status, page=page)
    return [(x.id, x.revision, x.place) for x in shown]


def asked_pages(marker: str | None) -> list[tuple[Page, str | None]]:
    """Orders both ways, pages smaller and larger than the leases, a status, a marker."""
    pages: list[tuple[Page, str | None]] = []
    for key in ("created_at", "name", "start_date", "end_date", "status"):
        for direction in ("asc", "desc"):
            for limit in (2, 5, None):
                pages.append((Page(limit=limit, sort_key=key, sort_dir=direction), None))
    pages.append((Page(limit=3), "PENDING"))
    pages.append((Page(), "ACTIVE"))
    if marker is not None:
        pages += [
            (Page(marker=marker, limit=3), None),
            (Page(marker=marker, sort_key="name"), None),
        ]
    return pages


Step = tuple[str, Actor, int, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["create", "create", "retry", "rename", "move", "delete", "advance", "host"]
        ),
        st.sampled_from([ALICE, BOB]),
        st.integers(0, 7),
        st.integers(0, 12),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=16,
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=steps)
def test_every_page_kept_is_the_page_read_afresh(
    sqlite_template: Path, history: list[Step], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lease_pages, "KEPT_PAGES", 1000)  # every page asked stays kept
    with world_on_copy(sqlite_template) as world:
        leases, hosts, clock, manager = world.leases, world.hosts, world.clock, world.manager
        made: list[tuple[Actor, str]] = []
        for i, (kind, actor, pick, hours, length) in enumerate(history):
            start = clock.now() + hours * HOUR
            try:
                if kind in ("create", "retry"):
                    request = host_request(f"l{(i * 7) % 5}", start, start + length * HOUR)
                    if kind == "retry":  # starts now, or waits for a host
                        retry = host_request(f"r{i}", None, clock.now() + length * HOUR)
                        request = replace(retry, lease_type=LeaseType.RETRY)
                    made.append((actor, leases.create(actor, request).id))
                elif kind == "rename" and made:
                    owner, lease_id = made[pick % len(made)]
                    leases.update(owner, lease_id, LeaseChanges(name=f"n{hours}"))
                elif kind == "move" and made:
                    owner, lease_id = made[pick % len(made)]
                    leases.update(owner, lease_id, LeaseChanges(end=start + length * HOUR))
                elif kind == "delete" and made:
                    owner, lease_id = made.pop(pick % len(made))
                    leases.delete(owner, lease_id)
                elif kind == "advance":
                    clock.advance(hours * HOUR)
                    manager.run_due()
                elif kind == "host":
                    hosts.create(ADMIN, f"node-{i}", {"vcpus": 8})
                    leases.serve_queue(capacity_changed=True)
            except ClimateError:
                pass  # refused: the pages still hold
            marker = made[pick % len(made)][1] if made else None
            afresh = LeaseService(world.ctx)  # keeps no page yet
            for who in (ADMIN, ALICE):
                for page, status in asked_pages(marker if who is ADMIN else None):
                    expected = listed(afresh, who, page, status)
                    assert listed(leases, who, page, status) == expected, (page, status)


def test_every_change_to_a_lease_takes_the_next_number(sqlite_url: str, clock: ManualClock) -> None:
    """The sequence moves with each lease's revision, in commit order, and a lease deleted
    outright keeps its row (the numbers never go back)."""
    db = Database(sqlite_url)
    ctx = build_context(load_settings(env={}), db, clock)
    HostService(ctx).create(ADMIN, "node-1", {"vcpus": 8})
    leases = LeaseService(ctx)

    def numbers() -> dict[str, int]:
        with db.reader() as session:
            rows = session.execute(text("SELECT lease_id, seq FROM lease_revisions"))
            return {str(lease_id): int(seq) for lease_id, seq in rows.all()}

    first = leases.create(ALICE, host_request("a", T0 + HOUR, T0 + 2 * HOUR)).id
    second = leases.create(BOB, host_request("b", T0 + 3 * HOUR, T0 + 4 * HOUR)).id
    after_create = numbers()
    assert 0 < after_create[first] < after_create[second]
    leases.update(ALICE, first, LeaseChanges(name="renamed"))
    after_rename = numbers()
    assert after_rename[first] > after_create[second]
    assert after_rename[second] == after_create[second]
    with db.transaction() as session:
        session.execute(text("DELETE FROM events WHERE lease_id = :id"), {"id": first})
        session.execute(text("DELETE FROM host_allocations WHERE lease_id = :id"), {"id": first})
        session.execute(text("DELETE FROM reservations WHERE lease_id = :id"), {"id": first})
        session.execute(text("DELETE FROM leases WHERE id = :id"), {"id": first})
    gone = numbers()
    assert gone[first] > after_rename[first]
    assert max(gone.values()) == gone[first]
    db.dispose()


def test_too_many_changes_read_the_page_again(
    sqlite_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(sqlite_url)
    ctx = build_context(load_settings(env={}), db, clock)
    HostService(ctx).create(ADMIN, "node-1", {"vcpus": 8})
    leases = LeaseService(ctx)
    ids = [
        leases.create(
            ALICE, host_request(f"l{i}", T0 + (2 * i + 1) * HOUR, T0 + (2 * i + 2) * HOUR)
        ).id
        for i in range(4)
    ]
    before = listed(leases, ADMIN, Page(), None)
    with db.reader() as session:
        seq = lease_views.last_change(session)
    for lease_id in ids:
        leases.update(ALICE, lease_id, LeaseChanges(name=f"x-{lease_id}"))
    with db.reader() as session:
        assert lease_views.changed_since(session, seq, "created_at", 3) is None
        assert len(lease_views.changed_since(session, seq, "created_at", 4) or []) == 4
    monkeypatch.setattr(lease_pages, "MOST_CHANGES", 3)
    after = listed(leases, ADMIN, Page(), None)
    assert [x[0] for x in after] == [x[0] for x in before]
    assert after == listed(LeaseService(ctx), ADMIN, Page(), None)
    db.dispose()
