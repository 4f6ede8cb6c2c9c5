"""Statements on the admission path run below SQLAlchemy's execution: a statement is compiled
once per dialect and run on the transaction's own DBAPI cursor, its rows plain tuples. For the
few statements every admission runs where SQLAlchemy's per-execution and per-row work shows in
the profile (``python -m bench --scenario rules``): reads, and writes with ``RETURNING``; no
ORM autoflush runs before them. Everything else goes through SQLAlchemy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

_Compiled = tuple[SQLCompiler, dict[str, Callable[[Any], Any]]]
_CACHE: dict[tuple[int, str], tuple[ClauseElement, _Compiled]] = {}


def _compiled(statement: ClauseElement, dialect: Dialect) -> _Compiled:
    key = (id(statement), dialect.name)
    found = _CACHE.get(key)
    if found is None or found[0] is not statement:
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            process = bind.type.bind_processor(dialect)
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
    values = compiled.construct_params(dict(params))
    assert values is not None
    for name, process in processors.items():
        values[name] = process(values[name])
    positions = getattr(compiled, "positiontup", None)
    args: Any = [values[name] for name in positions] if positions else values
    cursor = connection.connection.cursor()
    try:
        cursor.execute(compiled.string, args)
        return list(cursor.fetchall())
    finally:
        cursor.close()
