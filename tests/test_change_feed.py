"""What a change feed vouches for (``db/change_feed.py``): the reservations changed over a range
of versions only when every version in it was told with its ids; anything less sends the
calendar to the log. Against a brute-force oracle."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from climate.db.change_feed import KEEP_VERSIONS, MOST_PAYLOAD, Told, parse, payload

IDS = st.frozensets(st.uuids().map(str), max_size=6)
# A version's notification: its ids, "*" (too many to carry), or never heard.
TOLD = st.one_of(IDS, st.just("*"), st.none())


@given(version=st.integers(0, 10**9), ids=IDS)
def test_a_payload_reads_back_as_its_version_and_ids(version: int, ids: frozenset[str]) -> None:
    assert parse(payload(version, ids)) == (version, ids)


def test_ids_beyond_a_payload_are_told_as_too_many() -> None:
    many = {str(uuid.uuid4()) for _ in range(MOST_PAYLOAD // 36 + 1)}
    text = payload(7, many)
    assert len(text.encode()) < 8000  # PostgreSQL's limit for a NOTIFY payload
    assert parse(text) == (7, None)


def test_an_unreadable_payload_is_ignored() -> None:
    told = Told()
    told.listening_from(0)
    told.heard("not a version")
    assert told.latest() is None
    assert told.between(0, 1) is None


@settings(max_examples=200, deadline=None)
@given(
    since=st.one_of(st.none(), st.integers(0, 5)),
    heard=st.lists(TOLD, max_size=12),
    after=st.integers(0, 12),
    span=st.integers(0, 6),
)
def test_a_range_is_vouched_for_only_when_every_version_in_it_was_told(
    since: int | None,
    heard: list[frozenset[str] | str | None],
    after: int,
    span: int,
) -> None:
    told = Told()
    told.listening_from(since)
    for version, ids in enumerate(heard, start=1):
        if ids is None:
            continue
        told.heard(payload(version, ids) if ids != "*" else f"{version} *")
    upto = after + span
    expected: set[str] | None = set()
    if since is None or after < since:
        expected = None
    for version in range(after + 1, upto + 1):
        ids = heard[version - 1] if version <= len(heard) else None
        if expected is None or not isinstance(ids, frozenset):
            expected = None
            break
        expected |= ids
    assert told.between(after, upto) == expected


def test_listening_lost_forgets_everything_told() -> None:
    told = Told()
    told.listening_from(3)
    told.heard(payload(4, {"r1"}))
    assert told.between(3, 4) == {"r1"}
    told.listening_from(None)
    assert told.between(3, 4) is None
    told.listening_from(4)  # listening again, from the version read then
    assert told.between(3, 4) is None
    assert told.between(4, 4) == set()


def test_the_oldest_versions_are_forgotten_past_the_bound() -> None:
    told = Told()
    told.listening_from(0)
    for version in range(1, KEEP_VERSIONS + 3):
        told.heard(payload(version, {f"r{version}"}))
    assert told.between(0, 5) is None  # versions 1 and 2 are gone
    assert told.between(2, 4) == {"r3", "r4"}
    assert told.latest() == KEEP_VERSIONS + 2
