"""Ids sent in ``IN`` lists a chunk at a time, as the ORM's selectin loading sends them:
SQLite caps a statement's parameters."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

IN_LIST = 500
"""Ids per ``IN`` list."""

T = TypeVar("T")


def chunked(ids: Sequence[T]) -> Iterator[Sequence[T]]:
    """``ids`` in consecutive slices of at most ``IN_LIST``."""
    for begin in range(0, len(ids), IN_LIST):
        yield ids[begin : begin + IN_LIST]
