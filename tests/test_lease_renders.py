"""``GET /v1/leases`` renders a lease again only when its rows changed (``lease_revisions``,
counted by SQLite's triggers; ``services/leases/listing.py``, ``api/lease_renders.py``): a
listing through the kept renders must be, byte for byte, the listing rendered afresh, whatever
happened to the leases in between."""

from __future__ import annotations

import datetime as dt
import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from climate import wire
from climate.api.lease_renders import Renders
from climate.config import load_settings
from climate.db.engine import Database
from climate.domain.actor import Actor
from climate.domain.clock import ManualClock
from climate.domain.status import LeaseType
from climate.errors import ClimateError, NotFound
from climate.jsontext import encode
from climate.runtime import build_context
from climate.services.hosts import HostService
from climate.services.leases import LeaseChanges, LeaseService
from climate.services.leases.listing import Shown
from tests.conftest import ADMIN, ALICE, BOB, T0
from tests.helpers import host_request, nothing_kept, world_on_copy

HOUR = dt.timedelta(hours=1)


def fresh(leases: LeaseService) -> bytes:
    """The listing with nothing kept: the page read (no page kept: ``db/lease_pages.py``),
    every lease loaded and rendered."""
    return Renders().body(LeaseService(leases.ctx).list_revised(ADMIN, nothing_kept))


def through(renders: Renders, leases: LeaseService) -> bytes:
    return renders.body(leases.list_revised(ADMIN, renders.get))


def revisions(db: Database) -> dict[str, int]:
    with db.reader() as session:
        rows = session.execute(text("SELECT lease_id, revision FROM lease_revisions"))
        return {str(lease_id): int(revision) for lease_id, revision in rows.all()}


@pytest.fixture
def two(sqlite_url: str, clock: ManualClock) -> Iterator[tuple[Database, LeaseService, str, str]]:
    """Two hosts with a lease of Alice's and one of Bob's: the database, the leases, their ids."""
    db = Database(sqlite_url)
    ctx = build_context(load_settings(env={}), db, clock)
    for name in ("node-1", "node-2"):
        HostService(ctx).create(ADMIN, name, {"vcpus": 8})
    leases = LeaseService(ctx)
    mine = leases.create(ALICE, host_request("mine", T0 + HOUR, T0 + 2 * HOUR)).id
    theirs = leases.create(BOB, host_request("theirs", T0 + HOUR, T0 + 2 * HOUR)).id
    yield db, leases, mine, theirs
    db.dispose()


def test_a_listing_renders_only_the_leases_that_changed(
    two: tuple[Database, LeaseService, str, str],
) -> None:
    db, leases, mine, theirs = two
    renders = Renders()
    assert through(renders, leases) == fresh(leases)
    loaded: list[str] = []

    def kept(lease_id: str, revision: int, place: int | None) -> bytes | None:
        found = renders.get(lease_id, revision, place)
        if found is None:
            loaded.append(lease_id)
        return found

    assert renders.body(leases.list_revised(ADMIN, kept)) == fresh(leases)
    assert loaded == []  # nothing changed: nothing loaded
    before = revisions(db)
    leases.update(ALICE, mine, LeaseChanges(name="renamed"))
    after = revisions(db)
    assert after[mine] > before[mine] and after[theirs] == before[theirs]
    body = renders.body(leases.list_revised(ADMIN, kept))
    assert loaded == [mine]
    assert body == fresh(leases) and b'"name":"renamed"' in body


def shown(renders: Renders, leases: LeaseService, actor: Actor, lease_id: str) -> bytes:
    return renders.one(leases.get_revised(actor, lease_id, renders.get))


def test_a_lease_shown_alone_is_rendered_again_only_when_it_changed(
    two: tuple[Database, LeaseService, str, str],
) -> None:
    _, leases, mine, theirs = two
    renders = Renders()
    first = shown(renders, leases, ALICE, mine)
    afresh = leases.get_revised(ALICE, mine, nothing_kept)
    assert afresh.lease is not None
    assert json.loads(first) == wire.lease(leases.get(ALICE, mine))  # as the ORM's lease shows
    assert leases.get_revised(ALICE, mine, renders.get).lease is None  # kept: not loaded
    leases.update(ALICE, mine, LeaseChanges(name="renamed"))
    again = leases.get_revised(ALICE, mine, renders.get)
    assert again.kept is None and again.lease is not None  # changed: loaded again
    assert json.loads(renders.one(again))["name"] == "renamed"
    # Kept renders never show a lease to whom the policy hides it.
    assert json.loads(shown(renders, leases, BOB, theirs))["id"] == theirs
    with pytest.raises(NotFound):
        shown(renders, leases, BOB, mine)
    assert json.loads(shown(renders, leases, ADMIN, mine))["name"] == "renamed"


def test_a_deleted_lease_is_not_shown_from_what_was_kept(
    two: tuple[Database, LeaseService, str, str],
) -> None:
    _, leases, mine, _ = two
    renders = Renders()
    shown(renders, leases, ALICE, mine)
    leases.delete(ALICE, mine)
    with pytest.raises(NotFound):
        shown(renders, leases, ALICE, mine)


def test_a_waiting_lease_is_shown_with_its_new_place_when_one_ahead_leaves_the_queue(
    sqlite_url: str, clock: ManualClock
) -> None:
    db = Database(sqlite_url)
    leases = LeaseService(build_context(load_settings(env={}), db, clock))  # no host at all

    def waiting(name: str) -> str:
        asked = host_request(name, None, T0 + HOUR)
        return leases.create(ALICE, replace(asked, lease_type=LeaseType.RETRY)).id

    ahead, behind = waiting("ahead"), waiting("behind")
    renders = Renders()
    assert b'"queue_position":2' in through(renders, leases)
    revision = revisions(db).get(behind, 0)
    leases.delete(ALICE, ahead)
    assert revisions(db).get(behind, 0) == revision  # its own rows did not change
    body = through(renders, leases)
    assert body == fresh(leases) and b'"queue_position":1' in body
    db.dispose()


def test_every_write_to_a_lease_or_its_rows_moves_its_revision_and_no_other(
    two: tuple[Database, LeaseService, str, str],
) -> None:
    db, _, mine, theirs = two
    assert set(revisions(db)) == {mine, theirs}
    writes = {
        "reservations": "UPDATE reservations SET status = status WHERE lease_id = :l",
        "events": "UPDATE events SET attempts = attempts + 1 WHERE lease_id = :l",
        "allocations": "UPDATE host_allocations SET end_date = end_date WHERE lease_id = :l",
        "leases": "UPDATE leases SET name = name || '!' WHERE id = :l",
        "events deleted": "DELETE FROM events WHERE lease_id = :l AND seq = 0",
    }
    for what, statement in writes.items():
        before = revisions(db)
        with db.transaction() as session:
            session.execute(text(statement), {"l": mine})
        after = revisions(db)
        assert after[mine] > before[mine], what
        assert {k: v for k, v in after.items() if k != mine} == {
            k: v for k, v in before.items() if k != mine
        }, what
    with db.transaction(rollback=True) as session:  # a change rolled back moves nothing
        session.execute(text(writes["leases"]), {"l": mine})
    assert revisions(db)[mine] == after[mine]


def test_postgresql_counts_no_revision_and_renders_every_lease(
    pg_url: str, clock: ManualClock
) -> None:
    from tests.conftest import _reset_pg

    _reset_pg(pg_url)
    db = Database(pg_url)
    ctx = build_context(load_settings(env={}), db, clock)
    leases = LeaseService(ctx)
    HostService(ctx).create(ADMIN, "node-1", {"vcpus": 8})
    leases.create(ALICE, host_request("first", T0 + HOUR, T0 + 2 * HOUR))
    shown = leases.list_revised(ADMIN, lambda *_: b"never asked")
    assert [(s.revision, s.kept, s.lease is not None) for s in shown] == [(None, None, True)]
    renders = Renders()
    assert through(renders, leases) == fresh(leases) and renders.size == 0
    db.dispose()


def test_renders_kept_stay_within_their_bytes_least_recently_shown_dropped_first() -> None:
    renders = Renders(limit=100)
    for name in "abcd":
        renders.put(name, 1, None, b"x" * 40)
    assert renders.size <= 100
    assert renders.get("a", 1, None) is None and renders.get("b", 1, None) is None
    assert renders.get("c", 1, None) == b"x" * 40
    renders.put("e", 1, None, b"y" * 40)  # c was shown last: d goes
    assert renders.get("d", 1, None) is None and renders.get("c", 1, None) is not None
    assert renders.get("c", 2, None) is None  # another revision
    assert renders.get("c", 1, 3) is None  # another queue place


def test_a_lease_dropped_while_it_is_read_is_still_answered_for() -> None:
    """``get`` takes no lock: a put that drops the entry between its read and its move to the
    end leaves it the entry it read, which still answers for its revision."""
    renders = Renders(limit=100)
    renders.put("a", 1, None, b"x" * 60)

    class DroppedOnRead(OrderedDict[str, tuple[int, int | None, bytes]]):
        def get(self, key: str, default: object = None) -> Any:
            found = super().get(key, default)
            renders._kept = OrderedDict(self)  # the put below works on a plain dict again
            renders.put("b", 1, None, b"y" * 60)  # over the limit: "a" is dropped
            return found

    renders._kept = DroppedOnRead(renders._kept)
    assert renders.get("a", 1, None) == b"x" * 60
    assert renders.get("a", 1, None) is None and renders.get("b", 1, None) == b"y" * 60


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_a_page_encoded_in_pieces_is_the_page_encoded_at_once(count: int) -> None:
    leases = [
        {"name": "é\u2028\x00", "n": 1},
        {"name": "b", "nested": [1.5, None, True]},
        {"name": "c"},
    ][:count]
    pieces = [Shown(str(i), i, None, encode(x), None) for i, x in enumerate(leases)]
    assert Renders().body(pieces) == encode({"leases": leases})


# -- random histories ----------------------------------------------------------------------

Step = tuple[str, int, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["create", "retry", "update", "delete", "advance", "host"]),
        st.integers(0, 5),
        st.integers(0, 12),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=steps)
def test_a_listing_through_kept_renders_is_the_listing_rendered_afresh(
    sqlite_template: Path, history: list[Step]
) -> None:
    with world_on_copy(sqlite_template) as world:
        leases, hosts, clock, manager = world.leases, world.hosts, world.clock, world.manager
        renders = Renders()
        made: list[str] = []
        for i, (kind, pick, hours, length) in enumerate(history):
            start = clock.now() + hours * HOUR
            try:
                if kind in ("create", "retry"):
                    request = host_request(f"l{i}", start, start + length * HOUR)
                    if kind == "retry":  # starts now, or waits for a host
                        retry = host_request(f"l{i}", None, clock.now() + length * HOUR)
                        request = replace(retry, lease_type=LeaseType.RETRY)
                    made.append(leases.create(ALICE, request).id)
                elif kind == "update" and made:
                    changes = LeaseChanges(name=f"u{i}", end=start + length * HOUR)
                    leases.update(ALICE, made[pick % len(made)], changes)
                elif kind == "delete" and made:
                    leases.delete(ALICE, made.pop(pick % len(made)))
                elif kind == "advance":
                    clock.advance(hours * HOUR)
                    manager.run_due()
                elif kind == "host":
                    hosts.create(ADMIN, f"node-{i}", {"vcpus": 8})
                    leases.serve_queue(capacity_changed=True)
            except ClimateError:
                pass  # refused (no capacity, a lease that has ended): the listing still holds
            assert through(renders, leases) == fresh(leases)
