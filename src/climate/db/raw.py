"""Statements on the admission path run below SQLAlchemy's execution: a statement is compiled
once per dialect and run on the transaction's own DBAPI cursor, its rows plain tuples. For the
few statements every admission runs where SQLAlchemy's per-execution and per-row work shows in
the profile (``python -m bench --scenario rules`` and ``limit``): reads, writes with
``RETURNING``, and the inserts of a new lease's rows. No ORM autoflush runs before ``rows``;
``write`` flushes first, as ``Session.execute`` would (an allocation may name a reservation the
unit of work has not written yet). The DBAPI's errors come wrapped as SQLAlchemy's would
(``IntegrityError``, ``OperationalError``). Everything else goes through SQLAlchemy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter, ClauseElement

from climate.db.types import UTCDateTime, sqlite_time

_Process = Callable[[Any], Any]
_NO_VALUE = object()


@dataclass(frozen=True)
class _Bind:
    """One parameter of a compiled statement, in the order the DBAPI takes them."""

    name: str
    """As the DBAPI names it (a named paramstyle's key)."""
    key: str
    """As the caller names it (``params``)."""
    fixed: Any
    """The value compiled into the statement, if any (``_NO_VALUE``: the caller must give it)."""
    process: _Process | None


@dataclass(frozen=True)
class _Compiled:
    compiled: SQLCompiler
    binds: tuple[_Bind, ...]
    positional: bool
    arguments: Callable[[Mapping[str, Any]], Any] | None
    """The DBAPI's arguments from the caller's parameters, where every parameter is the
    caller's or a fixed value (none computed at execution, so no ``construct_params``)."""


_CACHE: dict[tuple[int, str, tuple[str, ...]], tuple[ClauseElement, _Compiled]] = {}


def _compiled(
    statement: ClauseElement, dialect: Dialect, columns: tuple[str, ...] = ()
) -> _Compiled:
    key = (id(statement), dialect.name, columns)
    found = _CACHE.get(key)
    if found is None or found[0] is not statement:
        compiled = cast(
            SQLCompiler, statement.compile(dialect=dialect, column_keys=list(columns) or None)
        )
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        positions = getattr(compiled, "positiontup", None)
        binds = tuple(
            _Bind(
                compiled.escaped_bind_names.get(name, name),
                by_name[name].key,
                _NO_VALUE if by_name[name].required else by_name[name].value,
                _processor(by_name[name], dialect),
            )
            for name in (positions or by_name)
        )
        plain = all(b.callable is None and not b.expanding for b in by_name.values())
        arguments = _arguments_of(binds, bool(positions)) if plain else None
        found = (statement, _Compiled(compiled, binds, bool(positions), arguments))
        _CACHE[key] = found
    return found[1]


def _processor(bind: BindParameter[Any], dialect: Dialect) -> _Process | None:
    if isinstance(bind.type, UTCDateTime) and dialect.name == "sqlite":
        return sqlite_time  # the same text as SQLAlchemy's chain, in one call
    # The dialect's own processing too (SQLite's text form of a time, with its microseconds),
    # as SQLAlchemy's execution applies it.
    return bind.type.dialect_impl(dialect).bind_processor(dialect)


def rows(session: Session, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
    """The rows of ``statement`` (or of its ``RETURNING``) with ``params``, as tuples, in the
    session's transaction."""
    connection = _connection(session)
    plan = _compiled(statement, connection.dialect)
    args = _arguments(plan, params)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(plan.compiled.string, args)
        return list(cursor.fetchall())
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, plan.compiled.string, args) from error
    finally:
        cursor.close()


def rows_then_commit(
    session: Session, statement: ClauseElement, params: Mapping[str, Any]
) -> list[Any]:
    """PostgreSQL: ``rows``, with the transaction's COMMIT sent in the same round trip
    (psycopg's pipeline mode): a row ``statement`` locks is held until the commit ends, not
    also while this process gets back to send the COMMIT (under load, a wait for the GIL of
    up to a switch interval). The session's own commit then finds nothing left to do."""
    connection = _connection(session)
    plan = _compiled(statement, connection.dialect)
    args = _arguments(plan, params)
    driver: Any = connection.connection.driver_connection
    try:
        with driver.pipeline():
            cursor = driver.cursor()
            cursor.execute(plan.compiled.string, args)
            driver.commit()
            return list(cursor.fetchall())
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, plan.compiled.string, args) from error


def write(session: Session, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
    """Run ``statement`` (an INSERT, UPDATE or DELETE without ``RETURNING``) once per row of
    ``rows``, which all have the same keys, in one DBAPI ``executemany`` in the session's
    transaction. An INSERT writes exactly the rows' keys: give every column without a
    server-side default."""
    if not rows:
        return
    session.flush()
    connection = _connection(session)
    plan = _compiled(statement, connection.dialect, tuple(rows[0]))
    args = [_arguments(plan, row) for row in rows]
    cursor = connection.connection.cursor()
    try:
        cursor.executemany(plan.compiled.string, args)
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, plan.compiled.string, args) from error
    finally:
        cursor.close()


CONNECTION = "raw_connection"
"""Where a write transaction's session keeps its connection (``Database.transaction``): asking
the session each time cost as much as the statement's own arguments."""


def _connection(session: Session) -> Connection:
    found: Connection | None = session.info.get(CONNECTION)
    return session.connection() if found is None else found


def begin(connection: Connection, sql: str) -> None:
    """Run ``sql``, which starts a transaction, on ``connection``'s DBAPI connection."""
    driver = connection.connection.driver_connection
    assert driver is not None
    try:
        driver.execute(sql)
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, sql, ()) from error


def _arguments(plan: _Compiled, params: Mapping[str, Any]) -> Any:
    """The DBAPI's arguments: a list for a positional paramstyle (SQLite), a dict for a named
    one (psycopg), each value through its type's processor, as SQLAlchemy's execution would."""
    if plan.arguments is not None:
        try:
            return plan.arguments(params)
        except KeyError:
            pass  # a value missing: SQLAlchemy's error, below
    return _constructed(plan, params)


def _arguments_of(binds: tuple[_Bind, ...], positional: bool) -> Callable[[Mapping[str, Any]], Any]:
    """A function of the caller's parameters that makes the DBAPI's arguments in one
    expression: an admission makes a few hundred, and a loop over the binds, with its
    attribute reads and checks per value, was most of their cost. A missing value without a
    fixed one raises ``KeyError``."""
    names: dict[str, Any] = {}
    values = []
    for i, bind in enumerate(binds):
        names[f"k{i}"] = bind.key
        if bind.fixed is _NO_VALUE:
            value = f"p[k{i}]"
        else:
            names[f"f{i}"] = bind.fixed
            value = f"p.get(k{i}, f{i})"
        if bind.process is not None:
            names[f"c{i}"] = bind.process
            value = f"c{i}({value})"
        values.append(value if positional else f"n{i}: {value}")
        names[f"n{i}"] = bind.name
    body = f"[{', '.join(values)}]" if positional else f"{{{', '.join(values)}}}"
    source = f"def arguments(p):\n    return {body}\n"
    exec(source, names)  # the source holds only names made above, never a value
    return cast(Callable[[Mapping[str, Any]], Any], names["arguments"])


def _constructed(plan: _Compiled, params: Mapping[str, Any]) -> Any:
    values = plan.compiled.construct_params(dict(params))
    assert values is not None
    processes = {bind.name: bind.process for bind in plan.binds if bind.process is not None}
    for name, process in processes.items():  # once per name: a bind may come twice
        values[name] = process(values[name])
    if plan.positional:
        return [values[bind.name] for bind in plan.binds]
    return values


def _wrapped(error: Exception, connection: Connection, sql: str, args: Any) -> DBAPIError:
    dbapi = connection.dialect.loaded_dbapi
    return cast(
        DBAPIError,
        DBAPIError.instance(sql, args, error, dbapi.Error, dialect=connection.dialect),
    )
