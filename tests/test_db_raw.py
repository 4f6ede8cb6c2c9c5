"""Statements run on the DBAPI cursor (``db/raw.py``): the balance update, the ledger row and
the inventory version read and write what SQLAlchemy's execution did, on both databases; the
DBAPI's errors come out as SQLAlchemy's."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import DateTime, bindparam, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, InvalidRequestError

from climate.db import credits as credit_rows
from climate.db import hosts as host_rows
from climate.db import raw
from climate.db.engine import ADMISSION_LOCK, Database
from climate.db.tables import HostAllocation, Lock, ManagerProcess, table_of
from climate.db.types import UTCDateTime, iso_text, sqlite_time, utc_text
from climate.domain.formats import lease_date
from climate.services.hosts import HostService
from climate.services.leases import LeaseService
from tests.conftest import ALICE, T0
from tests.helpers import add_hosts, host_request

AT = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
# Naive bounds, as hypothesis takes them (a day in from the ends: any time zone stays in range).
EARLIEST = dt.datetime(1, 1, 2)  # noqa: DTZ001
LATEST = dt.datetime(9999, 12, 30)  # noqa: DTZ001


def entry(amount: int, project: str = "p") -> credit_rows.Entry:
    return credit_rows.Entry(project, None, "grant", amount, 0, "admin", AT)


def test_an_entry_moves_the_balance_only_when_it_stays_at_or_above_zero(db: Database) -> None:
    with db.transaction() as session:
        credit_rows.open_account(session, "p")
        credit_rows.open_account(session, "q")
        assert [
            None if w is None else w.balance_cents
            for w in (
                credit_rows.post(session, entry(100)),
                credit_rows.post(session, entry(-150)),  # refused: nothing written
                credit_rows.post(session, entry(0)),
                credit_rows.post(session, entry(-100)),
                credit_rows.post(session, entry(1, project="nobody")),  # no balance row
            )
        ] == [100, None, 100, 0, None]
    with db.reader() as session:
        assert credit_rows.balance(session, "p") == 0
        assert credit_rows.balance(session, "q") == 0  # another project's is not touched
        assert credit_rows.balance(session, "nobody") is None
        assert [e.balance_cents for e in credit_rows.entries(session, "p", 10)] == [100, 100, 0]
        assert credit_rows.entries(session, "nobody", 10) == []


def test_ledger_rows_read_back_as_written_in_order(db: Database) -> None:
    entries = [
        credit_rows.Entry("p", None, "grant", 1000, 0, "admin", AT, "start"),
        credit_rows.Entry("p", "lease-1", "encumber", -250, 250, "alice", AT, "create"),
    ]
    with db.transaction() as session:
        credit_rows.open_account(session, "p")
        written = [credit_rows.post(session, e) for e in entries]
    assert [w.balance_cents for w in written if w is not None] == [1000, 750]
    assert written[0] is not None and written[1] is not None and written[0].id < written[1].id
    with db.reader() as session:
        assert credit_rows.entries(session, "p", 10) == written


def test_the_inventory_version_reads_this_transactions_bump(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements = []
    real = raw.rows

    def counted(*args: Any) -> list[Any]:
        statements.append(args[1])
        return real(*args)

    monkeypatch.setattr(raw, "rows", counted)
    with db.transaction() as session:
        before = host_rows.inventory_version(session)
        assert host_rows.inventory_version(session) == before
        assert len(statements) == 1  # read once per transaction
        host_rows.bump_inventory(session)
        assert host_rows.inventory_version(session) == before + 1
        assert host_rows.inventory_version(session) == before + 1
        assert len(statements) == 2
    with db.reader() as session:
        assert host_rows.inventory_version(session) == before + 1


def test_a_write_the_database_refuses_raises_sqlalchemys_error(db: Database) -> None:
    taken = [{"name": ADMISSION_LOCK, "version": 0}]
    with pytest.raises(IntegrityError), db.transaction() as session:
        raw.write(session, insert(table_of(Lock)), taken)


def test_a_write_comes_after_what_the_session_has_not_written_yet(db: Database) -> None:
    locks = table_of(Lock)
    bump = (
        update(locks)
        .where(locks.c.name == bindparam("lock_name"))
        .values(version=locks.c.version + 1)
    )
    # Rolled back: a lock row left behind would show in other tests of the same database.
    with db.transaction(rollback=True) as session:
        session.add(Lock(name="pending", version=7))
        raw.write(session, bump, [{"lock_name": "pending"}])
        assert session.scalar(select(Lock.version).where(Lock.name == "pending")) == 8


def test_times_are_stored_as_the_orm_stores_them(
    db: Database, hosts: HostService, leases: LeaseService
) -> None:
    """A lease's allocations are written below the ORM; cut at the very instant they start (a
    lease deleted as it begins) they are gone, not kept holding nothing: on SQLite that needs
    both times in one text form."""
    add_hosts(hosts, 1)
    lease = leases.create(ALICE, host_request("now", T0, T0 + dt.timedelta(hours=1)))
    with db.transaction() as session:
        stored = session.execute(select(HostAllocation.start_date)).scalars().all()
        assert stored == [T0]
    leases.delete(ALICE, lease.id)
    with db.transaction() as session:
        assert session.execute(select(HostAllocation.id)).all() == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(moment=st.datetimes(min_value=EARLIEST, max_value=LATEST, timezones=st.timezones()))
def test_a_stored_time_reads_as_the_lease_date_the_wire_writes_of_it(
    db: Database, moment: dt.datetime
) -> None:
    """The allocation listings have the database write their times as text (``iso_text``):
    the very text ``wire.lease_date`` makes of the time read back."""
    row = ManagerProcess.name == "t"
    with db.transaction(rollback=True) as session:
        session.add(ManagerProcess(name="t", started_at=moment, heartbeat_at=moment))
        session.flush()
        parsed = session.scalars(select(ManagerProcess.started_at).where(row)).one()
        text = session.scalars(select(iso_text(ManagerProcess.started_at)).where(row)).one()
    assert text == lease_date(parsed)


@settings(max_examples=300, deadline=None)
@given(moment=st.datetimes(min_value=EARLIEST, max_value=LATEST, timezones=st.timezones()))
def test_a_time_is_bound_on_sqlite_as_sqlalchemy_s_two_steps_bind_it(moment: dt.datetime) -> None:
    dialect = sqlite.dialect()
    chain = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert chain is not None
    assert sqlite_time(moment) == chain(moment)


@settings(max_examples=300, deadline=None)
@given(moment=st.datetimes(min_value=EARLIEST, max_value=LATEST, timezones=st.timezones()))
def test_a_time_is_read_on_sqlite_as_sqlalchemy_s_two_steps_read_it(moment: dt.datetime) -> None:
    """``UTCDateTime`` reads SQLite's text in one call: the aware UTC time that SQLAlchemy's
    parse followed by ``process_result_value`` gave."""
    dialect = sqlite.dialect()
    stored = sqlite_time(moment)
    two_steps = DateTime(timezone=True).dialect_impl(dialect).result_processor(dialect, None)
    assert two_steps is not None
    expected = UTCDateTime().process_result_value(two_steps(stored), dialect)
    one_step = UTCDateTime().dialect_impl(dialect).result_processor(dialect, None)
    assert one_step is not None
    assert one_step(stored) == expected
    assert one_step(stored).tzinfo is dt.UTC
    assert one_step(None) is None


@settings(max_examples=300, deadline=None)
@given(
    moment=st.datetimes(min_value=EARLIEST, max_value=LATEST, timezones=st.timezones()),
    form=st.sampled_from(["stored", "T", "offset", "date", "minutes"]),
)
def test_any_stored_text_of_a_time_reads_as_parsing_it_then_making_it_utc(
    moment: dt.datetime, form: str
) -> None:
    """``utc_text`` appends an offset to read the stored text in one call; text of another
    form (an offset of its own, a date alone) reads as ``fromisoformat`` then UTC read it."""
    text = {
        "stored": sqlite_time(moment),
        "T": moment.replace(tzinfo=None).isoformat("T"),
        "offset": moment.isoformat(),
        "date": moment.date().isoformat(),
        "minutes": moment.replace(tzinfo=None).isoformat(" ", "minutes"),
    }[form]
    assert text is not None
    found = dt.datetime.fromisoformat(text)
    expected = found.replace(tzinfo=dt.UTC) if found.tzinfo is None else found.astimezone(dt.UTC)
    assert utc_text(text) == expected
    assert utc_text(text).tzinfo is dt.UTC


def test_a_naive_time_is_refused_by_the_sqlite_binding_too() -> None:
    with pytest.raises(ValueError, match="naive"):
        sqlite_time(dt.datetime(2030, 1, 1))  # noqa: DTZ001
    assert sqlite_time(None) is None


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.psycopg.dialect()])
def test_arguments_are_what_sqlalchemy_s_execution_builds(dialect: Any) -> None:
    """Parameters given, fixed in the statement and given twice, each through its type; a
    missing one raises SQLAlchemy's own error."""
    moves = table_of(HostAllocation)
    statement = (
        update(moves)
        .where(moves.c.reservation_id == bindparam("r"), moves.c.host_id == 7)
        .where(moves.c.start_date < bindparam("at"), moves.c.end_date > bindparam("at"))
        .values(end_date=bindparam("at"))
    )
    params = {"r": "res-1", "at": AT}
    plan = raw._compiled(statement, dialect)
    assert plan.arguments is not None  # made by the generated function, not construct_params
    fast = raw._arguments(plan, params)
    slow = raw._constructed(plan, params)
    assert fast == slow
    if dialect.name == "sqlite":
        assert sorted(fast, key=str) == ["2030-01-02 03:04:05.678000"] * 3 + [7, "res-1"]
    else:
        assert fast == {"r": "res-1", "host_id_1": 7, "at": AT}
    with pytest.raises(InvalidRequestError, match="'r'"):
        raw._arguments(plan, {"at": AT})
