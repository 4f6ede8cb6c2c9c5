"""Reads that take a list of values as one parameter (``db/types.in_listed``, ``among``) search
an index for them on SQLite: they used to render as ``... IN (...) = 1``, which SQLite's planner
cannot search an index for, so each such read scanned its whole table, slower as it grew."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.dialects import sqlite

from climate.db import instances, lease_views
from climate.db.tables import Event, Lease
from climate.db.types import among

STATEMENTS: dict[str, Any] = {
    "a listing's leases": lease_views._LEASES_OF,
    "their reservations": lease_views._RESERVATIONS_OF,
    "their events": lease_views._EVENTS_OF,
    **{f"their {part}": statement for part, _, statement in lease_views._ALLOCATIONS_OF},
    "instance uses of hosts": instances._USES_OF_HOSTS,
    "events among ids": select(Event.id, Event.time).where(among(Event.id, ["e1", "e2"])),
    "leases updated among ids": update(Lease).where(among(Lease.id, ["l1"])).values(status="X"),
}


def plan(database: str, statement: Any) -> list[str]:
    sql = str(statement.compile(dialect=sqlite.dialect()))
    with sqlite3.connect(database) as conn:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", ['["x"]'] * sql.count("?")).fetchall()
    return [row[3] for row in rows]


@pytest.mark.parametrize("name", list(STATEMENTS))
def test_a_listed_read_searches_an_index(sqlite_url: str, name: str) -> None:
    steps = plan(sqlite_url.removeprefix("sqlite:///"), STATEMENTS[name])
    scans = [s for s in steps if s.startswith("SCAN") and "json_each" not in s]
    assert not scans, steps
    assert any(s.startswith("SEARCH") and "USING" in s for s in steps), steps
