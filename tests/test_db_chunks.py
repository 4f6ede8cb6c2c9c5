"""Ids in ``IN`` lists a chunk at a time (db/chunks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from climate.db.chunks import IN_LIST, chunked


@given(st.integers(min_value=0, max_value=3 * IN_LIST + 1))
def test_chunks_cover_the_ids_in_order_each_within_the_cap(count: int) -> None:
    ids = [f"id-{i}" for i in range(count)]
    parts = list(chunked(ids))
    assert [i for part in parts for i in part] == ids
    assert all(0 < len(part) <= IN_LIST for part in parts)
    assert len(parts) == -(-count // IN_LIST)  # as few as the cap allows
