"""Row ids (``db.tables.new_id``): UUIDs of version 7, ordered by the millisecond they were made
in, random within it."""

from __future__ import annotations

import os
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor

from climate.db.tables import new_id


def test_an_id_is_a_uuid_of_version_7_with_the_time_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(made)
    assert str(parsed) == made  # the canonical 36-character form, lower case
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= parsed.int >> 80 <= after


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    made = []
    for _ in range(5):
        made.append(new_id())
        time.sleep(0.002)
    assert made == sorted(made)


def test_ids_made_in_the_same_millisecond_differ() -> None:
    many = [new_id() for _ in range(20_000)]
    assert len(set(many)) == len(many)


def test_every_id_is_in_the_canonical_form_whatever_its_random_bits() -> None:
    # Leading zero bits included: each field keeps its width.
    for _ in range(2_000):
        made = new_id()
        parsed = uuid.UUID(made)
        assert str(parsed) == made
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)


def test_threads_making_ids_at_once_never_make_the_same_one() -> None:
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: [new_id() for _ in range(5_000)], range(8)))
    made = [i for batch in batches for i in batch]
    assert len(set(made)) == len(made)


def test_a_forked_process_makes_ids_its_parent_does_not() -> None:
    new_id()  # the parent holds random bytes it has not used yet
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Eventlet, once another test imported it (oslo.messaging), warns at every fork.
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:
        os.close(read)
        os.write(write, "\n".join(new_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parents = {new_id() for _ in range(100)}
    with os.fdopen(read) as pipe:
        childs = set(pipe.read().split("\n"))
    os.waitpid(child, 0)
    assert len(childs) == 100
    # Made in the same milliseconds, so only their random bits can tell them apart.
    assert {i[14:] for i in childs}.isdisjoint({i[14:] for i in parents})
