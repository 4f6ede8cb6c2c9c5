"""Credits' rows (docs/credits.md): a balance per project, changed only with a ledger entry
(``post``: the entry written and its amount added to the balance in one statement, only where
the balance stays at or above zero), so no two transactions can take it below zero on any
database; the append-only ledger; and what a lease holds, to be priced. Amounts are whole
cents."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from climate.db import raw
from climate.db.records import CreditBalance, CreditEntry
from climate.db.tables import (
    HostAllocation,
    InstanceAllocation,
    Item,
    ItemAllocation,
    VolumeAllocation,
    table_of,
)

BALANCES = table_of(CreditBalance)
LEDGER = table_of(CreditEntry)
_BALANCE = BALANCES.c.balance_cents
_ENTRY = [c for c in LEDGER.c if c not in (LEDGER.c.id, LEDGER.c.balance_cents)]
_GIVEN = {c.name: bindparam(c.name, type_=c.type) for c in _ENTRY}
_OWN = BALANCES.c.project_id == _GIVEN["project_id"]
_AFTER = _BALANCE + _GIVEN["amount_cents"]
# Prebuilt: admission posts once; building the statement per call cost more than running it.
# SQLite serialises writers: the insert reads the balance, and the trigger of migration 0024
# adds the entry's amount to it. PostgreSQL: the balance's conditional UPDATE feeds the insert
# (a data-modifying WITH); a second post waits for the first's row lock, then re-checks the
# condition against the committed balance.
_POST_SQLITE = (
    LEDGER.insert()
    .from_select(
        [*_GIVEN, "balance_cents"],
        select(*_GIVEN.values(), _AFTER).where(_OWN, _AFTER >= 0),
    )
    .returning(LEDGER.c.id, LEDGER.c.balance_cents)
)
_MOVED = (
    update(BALANCES).where(_OWN, _AFTER >= 0).values(balance_cents=_AFTER).returning(_BALANCE)
).cte("moved")
_POST_POSTGRESQL = (
    LEDGER.insert()
    .from_select(
        [*_GIVEN, "balance_cents"],
        select(*_GIVEN.values(), _MOVED.c.balance_cents),
    )
    .returning(LEDGER.c.id, LEDGER.c.balance_cents)
)


@dataclass(frozen=True)
class Entry:
    project_id: str
    lease_id: str | None
    kind: str
    amount_cents: int
    encumbered_cents: int
    actor: str
    at: dt.datetime
    note: str | None = None


@dataclass(frozen=True)
class Written:
    """An entry as the ledger keeps it."""

    id: int
    entry: Entry
    balance_cents: int


def balance(session: Session, project_id: str) -> int | None:
    """The project's balance in cents; None: it never had one."""
    found = session.execute(
        select(BALANCES.c.balance_cents).where(BALANCES.c.project_id == project_id)
    ).scalar_one_or_none()
    return None if found is None else int(found)


def open_account(session: Session, project_id: str) -> None:
    """Make sure the project has a balance row (at zero if it had none)."""
    insert_ = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(
        insert_(BALANCES)
        .values(project_id=project_id, balance_cents=0)
        .on_conflict_do_nothing(index_elements=["project_id"])
    )


def post(session: Session, entry: Entry) -> Written | None:
    """Write ``entry`` to the ledger and add its amount to its project's balance, in one
    statement, unless that would take the balance below zero (or the project has no balance
    row): the entry as written, with the balance after it; None, nothing changed."""
    dialect = session.get_bind().dialect.name
    statement = _POST_POSTGRESQL if dialect == "postgresql" else _POST_SQLITE
    row = {
        "project_id": entry.project_id,
        "lease_id": entry.lease_id,
        "kind": entry.kind,
        "amount_cents": entry.amount_cents,
        "encumbered_cents": entry.encumbered_cents,
        "actor": entry.actor,
        "at": entry.at,
        "note": entry.note,
    }
    found = raw.rows(session, statement, row)
    if not found:
        return None
    ((new_id, after),) = found
    return Written(int(new_id), entry, int(after))


def encumbered(session: Session, lease_id: str) -> int | None:
    """What ``lease_id`` holds encumbered, in cents; None: it has no ledger entry."""
    found = session.execute(
        select(func.sum(LEDGER.c.encumbered_cents), func.count()).where(
            LEDGER.c.lease_id == lease_id
        )
    ).one()
    return None if not found[1] else int(found[0])


def entries(
    session: Session, project_id: str, limit: int, marker: int | None = None
) -> list[Written]:
    """The project's ledger, oldest first, from after entry ``marker``."""
    query = select(LEDGER).where(LEDGER.c.project_id == project_id)
    if marker is not None:
        query = query.where(LEDGER.c.id > marker)
    rows = session.execute(query.order_by(LEDGER.c.id).limit(limit)).all()
    return [_written(row) for row in rows]


def totals(session: Session, project_id: str) -> tuple[int, int]:
    """The sums of the project's ledger: of its amounts, and of what it holds encumbered."""
    found = session.execute(
        select(
            func.coalesce(func.sum(LEDGER.c.amount_cents), 0),
            func.coalesce(func.sum(LEDGER.c.encumbered_cents), 0),
        ).where(LEDGER.c.project_id == project_id)
    ).one()
    return int(found[0]), int(found[1])


def _written(row: Any) -> Written:
    entry = Entry(
        row.project_id,
        row.lease_id,
        row.kind,
        int(row.amount_cents),
        int(row.encumbered_cents),
        row.actor,
        row.at,
        row.note,
    )
    return Written(int(row.id), entry, int(row.balance_cents))


@dataclass(frozen=True)
class Holding:
    """One allocation of a lease: ``amounts`` of resource ``resource`` (of allocation table
    ``table``: ``host``, ``instance``, ``volume`` or an item kind) over [start, end)."""

    table: str
    resource: int
    amounts: tuple[int, ...]
    start: dt.datetime
    end: dt.datetime


_HOLDINGS = {
    table: select(model.start_date, model.end_date, *columns).where(
        model.lease_id == bindparam("lease_id")
    )
    for table, model, columns in (
        ("host", HostAllocation, [HostAllocation.host_id]),
        (
            "instance",
            InstanceAllocation,
            [InstanceAllocation.host_id, InstanceAllocation.vcpus, InstanceAllocation.memory_mb],
        ),
        ("volume", VolumeAllocation, [VolumeAllocation.pool_id, VolumeAllocation.size_gb]),
        ("items", ItemAllocation, [ItemAllocation.item_id, Item.kind]),
    )
}
_HOLDINGS["items"] = _HOLDINGS["items"].join(Item, Item.id == ItemAllocation.item_id)


def holdings(session: Session, lease_id: str, tables: Collection[str]) -> Iterator[Holding]:
    """Every allocation ``lease_id`` has in ``tables`` (``host``, ``instance``, ``volume``,
    ``items``), as this transaction sees it."""
    for table in tables:
        for row in session.execute(_HOLDINGS[table], {"lease_id": lease_id}):
            if table == "items":
                yield Holding(str(row[3]), int(row[2]), (1,), row[0], row[1])
            else:
                yield Holding(table, int(row[2]), tuple(int(v) for v in row[3:]) or (1,), *row[:2])
