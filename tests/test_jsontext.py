"""JSON columns are written by ``climate.jsontext`` (orjson, the standard library past its
integers) and read back as written, on both databases."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, Column, Integer, MetaData, Table, insert, select, text

from climate import jsontext
from climate.db.engine import Database

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_a_value_reads_back_as_it_was_whatever_wrote_it(value: Any) -> None:
    assert json.loads(jsontext.text(value)) == value


def test_orjson_writes_what_it_can_and_the_library_the_rest() -> None:
    assert jsontext.text({"reminders": [3600, 60]}) == '{"reminders":[3600,60]}'
    assert jsontext.text([2**70]) == f"[{2**70}]"


def test_a_json_column_is_stored_as_compact_text_and_read_back(db: Database) -> None:
    table = Table("jsontext_probe", MetaData(), Column("id", Integer, primary_key=True))
    table.append_column(Column("value", JSON))
    table.create(db.engine)
    try:
        values = [{"b": [1, 2], "a": None}, [2**70, "x"], "text"]
        with db.engine.begin() as conn:
            conn.execute(insert(table), [{"id": i, "value": v} for i, v in enumerate(values)])
        with db.engine.connect() as conn:
            read = [row.value for row in conn.execute(select(table).order_by(table.c.id))]
            stored = conn.execute(
                text("SELECT CAST(value AS TEXT) FROM jsontext_probe WHERE id = 0")
            )
            assert read == values
            # Both keep the text as written (PostgreSQL's json type, unlike jsonb, does).
            assert stored.scalar() == '{"b":[1,2],"a":null}'
    finally:  # the PostgreSQL test database outlives this test: leave its schema as it was
        table.drop(db.engine)
