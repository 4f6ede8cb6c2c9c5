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
from typing import Any, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

_Compiled = tuple[SQLCompiler, dict[str, Callable[[Any], Any]]]
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
        processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            # The dialect's own processing too (SQLite's text form of a time, with its
            # microseconds), as SQLAlchemy's execution applies it.
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        found = (statement, (compiled, processors))
        _CACHE[key] = found
    return found[1]


def rows(session: Session, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
    """The rows of ``statement`` (or of its ``RETURNING``) with ``params``, as tuples, in the
    session's transaction."""
    connection = session.connection()
    compiled, processors = _compiled(statement, connection.dialect)
    args = _arguments(compiled, processors, params)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(compiled.string, args)
        return list(cursor.fetchall())
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, compiled.string, args) from error
    finally:
        cursor.close()


def rows_then_commit(
    session: Session, statement: ClauseElement, params: Mapping[str, Any]
) -> list[Any]:
    """PostgreSQL: ``rows``, with the transaction's COMMIT sent in the same round trip
    (psycopg's pipeline mode): a row ``statement`` locks is held until the commit ends, not
    also while this process gets back to send the COMMIT (under load, a wait for the GIL of
    up to a switch interval). The session's own commit then finds nothing left to do."""
    connection = session.connection()
    compiled, processors = _compiled(statement, connection.dialect)
    args = _arguments(compiled, processors, params)
    driver: Any = connection.connection.driver_connection
    try:
        with driver.pipeline():
            cursor = driver.cursor()
            cursor.execute(compiled.string, args)
            driver.commit()
            return list(cursor.fetchall())
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, compiled.string, args) from error


def write(session: Session, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
    """Run ``statement`` (an INSERT, UPDATE or DELETE without ``RETURNING``) once per row of
    ``rows``, which all have the same keys, in one DBAPI ``executemany`` in the session's
    transaction. An INSERT writes exactly the rows' keys: give every column without a
    server-side default."""
    if not rows:
        return
    session.flush()
    connection = session.connection()
    compiled, processors = _compiled(statement, connection.dialect, tuple(rows[0]))
    args = [_arguments(compiled, processors, row) for row in rows]
    cursor = connection.connection.cursor()
    try:
        cursor.executemany(compiled.string, args)
    except connection.dialect.loaded_dbapi.Error as error:
        raise _wrapped(error, connection, compiled.string, args) from error
    finally:
        cursor.close()


def _arguments(
    compiled: SQLCompiler, processors: Mapping[str, Callable[[Any], Any]], params: Mapping[str, Any]
) -> Any:
    values = compiled.construct_params(dict(params))
    assert values is not None
    for name, process in processors.items():
        values[name] = process(values[name])
    positions = getattr(compiled, "positiontup", None)
    return [values[name] for name in positions] if positions else values


def _wrapped(error: Exception, connection: Connection, sql: str, args: Any) -> DBAPIError:
    dbapi = connection.dialect.loaded_dbapi
    return cast(
        DBAPIError,
        DBAPIError.instance(sql, args, error, dbapi.Error, dialect=connection.dialect),
    )
