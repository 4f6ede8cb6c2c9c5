"""Column types: timestamps are stored in UTC and always come back timezone-aware."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, DateTime, String, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import NullType, TypeDecorator, TypeEngine


class UTCDateTime(TypeDecorator[dt.datetime]):
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        # SQLite has no time zones: store naive UTC text, so that text order is time order.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        # One call where SQLAlchemy's chain made two (its parse of the text, then
        # ``process_result_value``): reads of allocations parse thousands.
        def process(value: str | None) -> dt.datetime | None:
            return None if value is None else utc_text(value)

        return process

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        assert isinstance(value, dt.datetime)
        return _in_utc(value)


def _in_utc(value: dt.datetime) -> dt.datetime:
    """``value`` as aware UTC, a naive one taken as UTC already."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


_parse = dt.datetime.fromisoformat


def utc_text(value: str) -> dt.datetime:
    """SQLite's stored text of a time (naive UTC, ``sqlite_time``) as an aware UTC time. Read
    with the offset appended: a tenth of the cost of parsing it, then ``replace(tzinfo=UTC)``
    (Python 3.11's ``replace`` parses keywords, about 0.9 us). Text of another form (an offset
    of its own, a date alone) is read as before."""
    try:
        found = _parse(value + "+00:00")
        if found.tzinfo is dt.UTC:  # not for a date alone: 3.11 drops the offset after it
            return found
    except ValueError:
        pass
    return _in_utc(_parse(value))


def sqlite_time(value: dt.datetime | None) -> str | None:
    """What a ``UTCDateTime`` column stores on SQLite for ``value``, as ``process_bind_param``
    and SQLite's ``DATETIME`` make it in two steps (``2030-01-02 03:04:05.006789``, naive UTC
    with its microseconds): the statements below the ORM (``db/raw.py``) bind times by it."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime given to a UTC column")
    if value.tzinfo is not dt.UTC:
        value = value.astimezone(dt.UTC)
    # The aware text cut before its offset: ``replace(tzinfo=None)`` cost more than this whole.
    return value.isoformat(" ", "microseconds")[:26]


def as_utc(value: object) -> dt.datetime:
    """An aggregate (min/max) result as aware UTC: SQLite returns those as naive text."""
    if isinstance(value, str):
        return utc_text(value)
    assert isinstance(value, dt.datetime)
    return _in_utc(value)


class iso_text(FunctionElement[str]):
    """A ``UTCDateTime`` column as naive UTC ISO 8601 text with microseconds (Blazar's lease
    date), made by the database: the allocation listings show thousands of times, and parsing
    each in Python to write it again was half their time. SQLite stores that text already, a
    space for its ``T`` (every stored time is in that one form since migration 0022)."""

    type = String()
    inherit_cache = True
    name = "iso_text"


@compiles(iso_text, "sqlite")
def _iso_text_sqlite(element: iso_text, compiler: SQLCompiler, **kw: Any) -> str:
    return f"replace({compiler.process(element.clauses, **kw)}, ' ', 'T')"


@compiles(iso_text, "postgresql")
def _iso_text_postgresql(element: iso_text, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"


class Listed(TypeDecorator[Collection[Any]]):
    """A list of values bound as one parameter: a JSON array on SQLite (read by ``json_each``),
    an array on PostgreSQL. The parameter of ``in_listed``."""

    impl = String
    cache_ok = True

    def __init__(self, item: TypeEngine[Any]) -> None:
        super().__init__()
        self.item = item

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(ARRAY(self.item))
        return dialect.type_descriptor(String())

    def process_bind_param(self, value: Collection[Any] | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        return list(value) if dialect.name == "postgresql" else json.dumps(list(value))


class in_listed(FunctionElement[Any]):
    """``column IN`` the values of one ``Listed`` parameter, named ``name`` (given at each
    execution: a statement built once binds any number of values as one; SQLAlchemy's
    expanding ``IN`` renders and binds each value on every call, at more cost than the query's
    own) or holding ``values`` (``among``)."""

    # Untyped: a Boolean on SQLite (no native booleans) renders as ``... = 1`` in a WHERE,
    # which the planner cannot search an index for: every such read scanned its whole table.
    type = NullType()
    inherit_cache = True
    name = "in_listed"

    def __init__(
        self,
        column: ColumnElement[Any] | InstrumentedAttribute[Any],
        name: str | None = None,
        values: Collection[Any] = (),
    ) -> None:
        listed = Listed(column.type)
        bound = bindparam(name, type_=listed) if name else bindparam(None, values, type_=listed)
        super().__init__(column, bound)


def among(
    column: ColumnElement[Any] | InstrumentedAttribute[Any], values: Collection[Any]
) -> in_listed:
    """``column IN values``, the values bound as one parameter however many: a batch's
    statements then neither render nor bind thousands of parameters, and SQLite's limit on
    their number never applies."""
    return in_listed(column, values=values)


@compiles(in_listed, "sqlite")
def _in_listed_sqlite(element: in_listed, compiler: SQLCompiler, **kw: Any) -> str:
    column, values = (compiler.process(c, **kw) for c in element.clauses)
    return f"({column} IN (SELECT value FROM json_each({values})))"


@compiles(in_listed, "postgresql")
def _in_listed_postgresql(element: in_listed, compiler: SQLCompiler, **kw: Any) -> str:
    column, values = (compiler.process(c, **kw) for c in element.clauses)
    return f"({column} = ANY({values}))"
