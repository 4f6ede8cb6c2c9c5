"""Admissions of whole hosts on PostgreSQL run side by side, each locking only the hosts it
books (``db/locking.py``); the same host is never booked twice, whichever way they meet."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from climate.config import Settings
from climate.db import allocations, locking, raw
from climate.db import hosts as host_rows
from climate.db import leases as lease_rows
from climate.db.calendar_cache import CalendarCache
from climate.db.change_feed import ChangeFeed
from climate.db.engine import ADMISSION_LOCK, Database
from climate.db.leases import EVENTS_CHANNEL
from climate.domain.clock import ManualClock
from climate.errors import Conflict, NotEnoughCapacity, UsageRuleBroken
from climate.runtime import build_context
from climate.services.context import ServiceContext
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from climate.services.leases import create as create_module
from tests.conftest import ADMIN, ALICE, BOB, T0, _reset_pg
from tests.helpers import host_request, hosts_of

HOUR = dt.timedelta(hours=1)
IN_A = '["==", "$pool", "a"]'
IN_B = '["==", "$pool", "b"]'
OVERLAPS = text(
    "SELECT count(*) FROM host_allocations a JOIN host_allocations b"
    " ON a.host_id = b.host_id AND a.id < b.id"
    " AND a.start_date < b.end_date AND b.start_date < a.end_date"
)


@pytest.fixture
def two_processes(
    pg_url: str, settings: Settings, clock: ManualClock
) -> Iterator[tuple[ServiceContext, ServiceContext]]:
    """Two API processes' worth of state (each its own engine and in-memory calendar) over one
    database with host 1 in pool a and host 2 in pool b."""
    yield from _processes(pg_url, settings, clock)


def _processes(
    pg_url: str, settings: Settings, clock: ManualClock
) -> Iterator[tuple[ServiceContext, ServiceContext]]:
    _reset_pg(pg_url)
    first, second = Database(pg_url), Database(pg_url)
    ours = build_context(settings, first, clock)
    HostService(ours).create(ADMIN, "compute-a", {"pool": "a"})
    HostService(ours).create(ADMIN, "compute-b", {"pool": "b"})
    try:
        yield ours, build_context(settings, second, clock)
    finally:
        first.dispose()
        second.dispose()


def _after_booking(monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]) -> None:
    """Run ``then`` in every creation's transaction right after its hosts are booked."""
    book = create_module.book

    def booked(*args: Any, **kwargs: Any) -> None:
        book(*args, **kwargs)
        then()

    monkeypatch.setattr(create_module, "book", booked)


def _overlaps(ctx: ServiceContext) -> int:
    with ctx.db.reader() as session:
        return int(session.scalar(OVERLAPS) or 0)


def test_two_admissions_on_disjoint_hosts_hold_open_transactions_at_the_same_time(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waits, hosts booked and transaction open, until the other has booked too: under
    one admission lock the second could not book before the first committed."""
    first, second = two_processes
    both_booked = threading.Barrier(2, timeout=10)
    _after_booking(monkeypatch, both_booked.wait)
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(
            LeaseService(first).create,
            ALICE,
            host_request("a", T0 + HOUR, T0 + 3 * HOUR, resource_properties=IN_A),
        )
        b = pool.submit(
            LeaseService(second).create,
            BOB,
            host_request("b", T0 + HOUR, T0 + 3 * HOUR, resource_properties=IN_B),
        )
        leases = a.result(timeout=30), b.result(timeout=30)
    assert [hosts_of(lease) for lease in leases] == [{1}, {2}]
    with first.db.reader() as session:
        numbered = session.scalar(text("SELECT version FROM locks WHERE name = 'admission'"))
        logged = session.scalar(text("SELECT count(DISTINCT version) FROM allocation_changes"))
    assert logged == 2  # each commit numbered once, its allocations logged under its number
    assert numbered is not None and numbered >= 2


def test_a_host_another_process_is_booking_is_left_to_an_admission_alone_which_refuses(
    two_processes: tuple[ServiceContext, ServiceContext],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second process's calendar does not show the first's open booking: it chooses the
    same host, finds it locked, and admits again alone once the first has committed."""
    first, second = two_processes
    first_booked, contended = threading.Event(), threading.Event()
    try_resources = locking.try_resources

    def trying(*args: Any) -> bool:
        got = try_resources(*args)
        if not got:
            contended.set()
        return got

    monkeypatch.setattr(locking, "try_resources", trying)
    main = threading.main_thread()

    def first_waits() -> None:
        if threading.current_thread() is not main:
            first_booked.set()
            assert contended.wait(10)

    _after_booking(monkeypatch, first_waits)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(
            LeaseService(first).create, ALICE, host_request("a", *window, resource_properties=IN_A)
        )
        assert first_booked.wait(10)  # else the second might book the host first
        with caplog.at_level(logging.DEBUG, "climate.services.leases.admission"):
            with pytest.raises(NotEnoughCapacity):
                LeaseService(second).create(
                    BOB, host_request("b", *window, resource_properties=IN_A)
                )
        assert hosts_of(a.result(timeout=30)) == {1}
    assert contended.is_set()
    assert "admitting alone: hosts [1]: booked meanwhile" in caplog.messages
    assert _overlaps(first) == 0


def test_a_host_booked_after_the_calendar_was_read_is_caught_by_the_database(
    two_processes: tuple[ServiceContext, ServiceContext],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first process commits between the second's calendar sync and its booking: the lock
    on the host is free again, and the exclusion constraint refuses the overlap; the second
    admits again alone, on a calendar caught up, and finds no room."""
    first, second = two_processes
    first_committed = threading.Event()
    second_synced = threading.Event()
    sync = CalendarCache._sync_shared

    def synced_then_wait(cache: CalendarCache, session: Any) -> None:
        sync(cache, session)
        if threading.current_thread() is threading.main_thread():
            second_synced.set()
            assert first_committed.wait(10)

    monkeypatch.setattr(CalendarCache, "_sync_shared", synced_then_wait)
    window = (T0 + HOUR, T0 + 3 * HOUR)

    def first_books() -> Any:
        assert second_synced.wait(10)
        lease = LeaseService(first).create(
            ALICE, host_request("a", *window, resource_properties=IN_A)
        )
        first_committed.set()
        return lease

    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(first_books)
        with caplog.at_level(logging.DEBUG, "climate.services.leases.admission"):
            with pytest.raises(NotEnoughCapacity):
                LeaseService(second).create(
                    BOB, host_request("b", *window, resource_properties=IN_A)
                )
        assert hosts_of(a.result(timeout=30)) == {1}
    assert any("exclusion constraint" in message for message in caplog.messages)
    assert _overlaps(first) == 0
    monkeypatch.setattr(CalendarCache, "_sync_shared", sync)
    # The refused attempts left the second process's calendar right: the host is free later.
    later = LeaseService(second).create(
        BOB, host_request("c", T0 + 3 * HOUR, T0 + 4 * HOUR, resource_properties=IN_A)
    )
    assert hosts_of(later) == {1}


def test_an_exclusive_admission_waits_for_shared_ones_and_sees_what_they_booked(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease that only moving another would make room for is admitted alone: the exclusive
    mode waits until the shared admission under way has committed, then counts its host."""
    first, second = two_processes
    booked, go = threading.Event(), threading.Event()

    def hold_open() -> None:
        if threading.current_thread() is not threading.main_thread():
            booked.set()
            assert go.wait(10)

    _after_booking(monkeypatch, hold_open)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(LeaseService(first).create, ALICE, host_request("a", *window))
        assert booked.wait(10)
        # Two hosts wanted: this process's calendar shows both free, the shared mode finds
        # one locked and goes alone, which waits.
        both = pool.submit(LeaseService(second).create, BOB, host_request("b", *window, 2))
        with pytest.raises(TimeoutError):
            both.result(timeout=0.5)  # waiting for the shared admission to end
        go.set()
        assert len(hosts_of(a.result(timeout=30))) == 1
        with pytest.raises(NotEnoughCapacity):
            both.result(timeout=30)
    assert _overlaps(first) == 0


def test_admissions_of_one_project_side_by_side_are_judged_by_its_rules_one_after_the_other(
    pg_url: str, settings: Settings, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both book at once on disjoint hosts; the project may hold one host at a time, and the
    second to be judged counts the first's host."""
    one_host = {"name": "one-host", "kind": "concurrent", "unit": "hosts", "limit": 1}
    ruled = settings.model_copy(update={"usage_rules": [{**one_host, "per": "project"}]})
    processes = _processes(pg_url, ruled, clock)
    first, second = next(processes)
    both_booked = threading.Barrier(2, timeout=10)
    _after_booking(monkeypatch, both_booked.wait)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    try:
        with ThreadPoolExecutor(2) as pool:
            tries = [
                pool.submit(
                    LeaseService(ctx).create,
                    ALICE,
                    host_request(name, *window, resource_properties=where),
                )
                for ctx, name, where in ((first, "a", IN_A), (second, "b", IN_B))
            ]
            outcomes = [t.exception(timeout=30) for t in tries]
    finally:
        processes.close()
    assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "UsageRuleBroken"]
    assert any(isinstance(o, UsageRuleBroken) and "one-host" in str(o) for o in outcomes)


def test_a_shared_admission_numbered_at_a_pruning_version_prunes_the_log_after_its_commit(
    two_processes: tuple[ServiceContext, ServiceContext],
) -> None:
    first, _ = two_processes
    horizon = 11_000 - allocations.KEEP_CHANGES
    with first.db.transaction() as session:
        session.execute(text("UPDATE locks SET version = 10999 WHERE name = 'admission'"))
        session.execute(
            text(
                "INSERT INTO allocation_changes (version, reservation_id)"
                " VALUES (5, 'old'), (:horizon, 'at'), (:after, 'kept')"
            ),
            {"horizon": horizon, "after": horizon + 1},
        )
    LeaseService(first).create(ALICE, host_request("a", T0 + HOUR, T0 + 2 * HOUR))
    with first.db.reader() as session:
        kept = session.execute(
            text("SELECT version, reservation_id FROM allocation_changes ORDER BY version")
        ).all()
        pruned = session.scalar(text("SELECT version FROM locks WHERE name = 'calendar_pruned'"))
    assert [tuple(row) for row in kept][0] == (horizon + 1, "kept")
    assert [row[0] for row in kept][1:] == [11_000]  # the lease's own reservation
    assert pruned == horizon
    # A prune that commits after a later one leaves the later horizon.
    with first.db.transaction(lock=ADMISSION_LOCK) as session:
        allocations.prune(session, 10_500)
    with first.db.reader() as session:
        assert (
            session.scalar(text("SELECT version FROM locks WHERE name = 'calendar_pruned'"))
            == horizon
        )


def test_other_processes_are_notified_only_of_events_within_the_managers_longest_sleep(
    two_processes: tuple[ServiceContext, ServiceContext], pg_url: str, clock: ManualClock
) -> None:
    """A manager reads the queue again within ``max_wait_seconds`` whatever it hears; every
    transaction that notifies commits one after the other on PostgreSQL."""
    first, _ = two_processes
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        far = clock.now() + dt.timedelta(days=2)
        LeaseService(first).create(ALICE, host_request("far", far, far + HOUR))
        soon = clock.now() + dt.timedelta(seconds=first.settings.max_wait_seconds / 2)
        LeaseService(first).create(ALICE, host_request("soon", soon, soon + HOUR))
        heard = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert heard == [soon.isoformat()]


def test_late_binding_is_searched_beside_other_admissions_and_applied_alone(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only moving a pending lease makes room: the moves are found in the shared mode, then
    made in the exclusive one. When no moves would do, the refusal never takes the exclusive
    mode, which would stop every other admission while the search runs."""
    first, _ = two_processes
    alone: list[str] = []
    exclusive = locking.exclusive

    def counted(session: Any) -> None:
        alone.append("exclusive")
        exclusive(session)

    monkeypatch.setattr(locking, "exclusive", counted)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    leases = LeaseService(first)
    anywhere = leases.create(ALICE, host_request("anywhere", *window))
    assert hosts_of(anywhere) == {1} and alone == []
    in_a = leases.create(BOB, host_request("in-a", *window, resource_properties=IN_A))
    assert hosts_of(in_a) == {1}
    assert hosts_of(leases.get(ALICE, anywhere.id)) == {2}  # moved, by the exclusive mode
    assert alone == ["exclusive"]
    with pytest.raises(NotEnoughCapacity):
        leases.create(BOB, host_request("in-a-too", *window, resource_properties=IN_A))
    assert alone == ["exclusive"]
    assert _overlaps(first) == 0


def _missing_every_change(monkeypatch: pytest.MonkeyPatch, *, on_reload_too: bool) -> None:
    """This process's calendars read no other process's change from the log (and, with
    ``on_reload_too``, none of the hosts' allocations when loaded whole): a calendar that
    missed a commit, which only the database's exclusion constraint then catches."""
    monkeypatch.setattr(allocations, "changes_since", lambda _session, _version, _upto: set())
    if on_reload_too:
        monkeypatch.setattr(host_rows, "spans_since", lambda _session, _since: [])


def test_a_booking_a_calendar_missed_is_refused_by_the_database_and_judged_on_a_reloaded_one(
    two_processes: tuple[ServiceContext, ServiceContext],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The second process believes host 1 free: the shared mode books it and the database
    refuses; alone, on the same calendar, it is refused again; alone once more, on a calendar
    loaded whole from the database, the request is refused for want of hosts, as it should be,
    instead of failing with the database's error."""
    first, second = two_processes
    window = (T0 + HOUR, T0 + 3 * HOUR)
    LeaseService(second).create(BOB, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    assert hosts_of(
        LeaseService(first).create(ALICE, host_request("a", *window, resource_properties=IN_A))
    ) == {1}
    _missing_every_change(monkeypatch, on_reload_too=False)
    with caplog.at_level(logging.WARNING, "climate.db.calendar_cache"):
        with pytest.raises(NotEnoughCapacity) as refused:
            LeaseService(second).create(BOB, host_request("b", *window, resource_properties=IN_A))
    assert str(refused.value).startswith("Not enough hosts available: 1 host(s) requested")
    assert caplog.messages == ["hosts calendar missed a committed booking of [1]: loading it again"]
    assert _overlaps(first) == 0
    # The reloaded calendar shows the first lease's host from here on; the other host is free.
    anywhere = LeaseService(second).create(BOB, host_request("c", *window))
    assert hosts_of(anywhere) == {2}
    assert _overlaps(first) == 0


def test_a_booking_the_database_keeps_refusing_is_a_conflict_naming_the_host(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded: three tries (shared, alone, alone on a calendar loaded again), then 409."""
    first, second = two_processes
    window = (T0 + HOUR, T0 + 3 * HOUR)
    LeaseService(second).create(BOB, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    LeaseService(first).create(ALICE, host_request("a", *window, resource_properties=IN_A))
    _missing_every_change(monkeypatch, on_reload_too=True)
    tries: list[bool] = []
    transaction = second.db.transaction

    def counted(**kwargs: Any) -> Any:
        tries.append(kwargs["shared"])
        return transaction(**kwargs)

    monkeypatch.setattr(second.db, "transaction", counted)
    with pytest.raises(Conflict) as refused:
        LeaseService(second).create(BOB, host_request("b", *window, resource_properties=IN_A))
    assert type(refused.value) is Conflict
    assert "hosts [1]" in str(refused.value) and "exclusion constraint" in str(refused.value)
    assert tries == [True, False, False]
    assert _overlaps(first) == 0


def test_a_prune_committing_while_a_reader_reads_the_log_never_hides_a_change(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's calendar far behind reads the log without the admission lock, statement by
    statement (read committed). A prune that commits between its statements must not leave it
    with changes missing: it gets them all, or None (load everything again)."""
    first, second = two_processes
    with first.db.transaction() as session:
        session.execute(
            text(
                "INSERT INTO allocation_changes (version, reservation_id)"
                " VALUES (10, 'cut'), (12000, 'kept')"
            )
        )
    pruned: list[bool] = []

    def prune_once(*_args: Any) -> None:
        if pruned:
            return
        pruned.append(True)  # after the reader's first statement, before its second
        with first.db.transaction(lock=ADMISSION_LOCK) as other:
            allocations.prune(other, 12_000)

    rows = raw.rows

    def rows_then_prune(session: Session, statement: Any, params: Any) -> list[Any]:
        found = rows(session, statement, params)
        prune_once()
        return found

    with second.db.reader() as session:
        session.execute(text("SELECT 1"))
        monkeypatch.setattr(raw, "rows", rows_then_prune)
        found = allocations.changes_since(session, 5, 12_000)
        monkeypatch.undo()
    assert pruned == [True]
    assert found is None or found >= {"cut", "kept"}


# -- the change feed: what other processes changed, told by NOTIFY (db/change_feed.py) -------


def _listening(process: ServiceContext) -> ChangeFeed:
    feed = process.db.feed
    assert feed is not None
    feed.start()
    _until(lambda: feed.listening, "the change feed to listen")
    return feed


def _told_up_to_now(process: ServiceContext, feed: ChangeFeed) -> None:
    with process.db.reader() as session:
        committed = lease_rows.admission_version(session)
    _until(lambda: (feed.latest() or 0) >= committed, f"version {committed} to be told")


def _refused_in_the_second_caught_up_from(
    first: ServiceContext,
    second: ServiceContext,
    feed: ChangeFeed,
    counter: str,
    window: tuple[dt.datetime, dt.datetime],
) -> None:
    """Once the first process's last change is told, the second refuses host 1 over ``window``
    (the first holds it), its calendar caught up once more through ``counter`` ("served": the
    feed's changes; "missed": the log's)."""
    _told_up_to_now(first, feed)
    before = getattr(feed, counter)
    with pytest.raises(NotEnoughCapacity):
        LeaseService(second).create(BOB, host_request("b", *window, resource_properties=IN_A))
    assert getattr(feed, counter) == before + 1
    assert _overlaps(first) == 0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"waited 10 s for {what}"
        time.sleep(0.01)


def test_a_calendar_catches_up_from_what_the_feed_told_without_reading_the_log(
    two_processes: tuple[ServiceContext, ServiceContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = two_processes
    feed = _listening(second)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    LeaseService(second).create(BOB, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    # A shared admission (numbered at commit) books host 1 in the first process.
    booked = LeaseService(first).create(ALICE, host_request("a", *window, resource_properties=IN_A))
    _told_up_to_now(first, feed)
    logged = allocations._CHANGED_SINCE
    rows = raw.rows

    def no_log(session: Session, statement: Any, params: Any) -> list[Any]:
        assert statement is not logged, "the log was read though the feed had every change"
        return rows(session, statement, params)

    monkeypatch.setattr(raw, "rows", no_log)
    with pytest.raises(NotEnoughCapacity):
        LeaseService(second).create(BOB, host_request("b", *window, resource_properties=IN_A))
    # An exclusive change (a delete) is told too: host 1 is free again in the second's calendar.
    LeaseService(first).delete(ALICE, booked.id)
    _told_up_to_now(first, feed)
    again = LeaseService(second).create(BOB, host_request("c", *window, resource_properties=IN_A))
    assert hosts_of(again) == {1}
    assert feed.served >= 2
    assert _overlaps(first) == 0


def test_changes_too_many_to_tell_are_read_from_the_log(
    two_processes: tuple[ServiceContext, ServiceContext],
) -> None:
    first, second = two_processes
    feed = _listening(second)
    window = (T0 + HOUR, T0 + 3 * HOUR)
    LeaseService(second).create(BOB, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    LeaseService(first).create(ALICE, host_request("a", *window, resource_properties=IN_A))
    with first.db.transaction(lock=ADMISSION_LOCK) as session:
        many = [str(uuid.uuid4()) for _ in range(300)]  # reservations since deleted
        allocations.record_changes(session, session.info["lock_version"], many)
    _refused_in_the_second_caught_up_from(first, second, feed, "missed", window)


def test_a_feed_that_lost_its_connection_listens_again_and_misses_nothing(
    two_processes: tuple[ServiceContext, ServiceContext], pg_url: str
) -> None:
    first, second = two_processes
    feed = _listening(second)
    LeaseService(second).create(BOB, host_request("warm", T0 + 5 * HOUR, T0 + 6 * HOUR))
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (ChangeFeed.APPLICATION_NAME,),
        )
    window = (T0 + HOUR, T0 + 3 * HOUR)
    # Booked while the feed may be down: the second process must see it either way.
    LeaseService(first).create(ALICE, host_request("a", *window, resource_properties=IN_A))
    with pytest.raises(NotEnoughCapacity):
        LeaseService(second).create(BOB, host_request("b", *window, resource_properties=IN_A))
    _until(lambda: feed.listening and (feed.latest() is None), "the feed to listen again")
    later = (T0 + 10 * HOUR, T0 + 12 * HOUR)
    LeaseService(first).create(ALICE, host_request("d", *later, resource_properties=IN_A))
    _refused_in_the_second_caught_up_from(first, second, feed, "served", later)
