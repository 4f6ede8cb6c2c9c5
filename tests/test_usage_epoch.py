"""The allocations' times as the usage rules read them on SQLite (``db.usage.epoch``): seconds
since the epoch to the millisecond, exactly the doubles ``ROUND(x, 3)`` gave before, for any
time a lease can have (after 1970), half milliseconds included."""

from __future__ import annotations

import datetime as dt
import sqlite3

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import column, select, table
from sqlalchemy.dialects import sqlite

from climate.db.usage import epoch

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TIMES = st.integers(10**9, 10**6 * 86400 * 365 * 1000).map(
    lambda us: EPOCH + dt.timedelta(microseconds=us)
)
HALF_MILLISECONDS = TIMES.map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000 + 500))


@given(st.lists(st.one_of(TIMES, HALF_MILLISECONDS), min_size=1, max_size=50))
def test_epoch_is_what_round_gave(times: list[dt.datetime]) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (d TEXT)")
    # As SQLAlchemy stores a DateTime in SQLite.
    db.executemany(
        "INSERT INTO t VALUES (?)", [(t.strftime("%Y-%m-%d %H:%M:%S.%f"),) for t in times]
    )
    ours = select(epoch(column("d"))).select_from(table("t"))
    found = [row[0] for row in db.execute(str(ours.compile(dialect=sqlite.dialect())))]
    rounded = "SELECT ROUND((julianday(d) - 2440587.5) * 86400.0, 3) FROM t"
    assert found == [row[0] for row in db.execute(rounded)]
