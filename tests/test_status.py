"""The transition tables: the one place that says which status may follow which."""

from __future__ import annotations

import pytest

from climate.domain.status import (
    EVENT_TRANSITIONS,
    LEASE_TRANSITIONS,
    RESERVATION_TRANSITIONS,
    EventStatus,
    LeaseStatus,
    ReservationStatus,
    check_event_transition,
    check_lease_transition,
    check_reservation_transition,
)
from climate.errors import Conflict

LEASE_PATH = ["PENDING", "STARTING", "ACTIVE", "TERMINATING", "TERMINATED"]


def test_a_lease_lives_pending_starting_active_terminating_terminated() -> None:
    for current, new in zip(LEASE_PATH, LEASE_PATH[1:], strict=False):
        check_lease_transition(current, LeaseStatus(new))


@pytest.mark.parametrize(
    ("current", "new"),
    [
        ("PENDING", "ACTIVE"),  # never without starting
        ("ACTIVE", "PENDING"),
        ("ACTIVE", "TERMINATED"),  # never without ending
        ("TERMINATED", "ACTIVE"),
        ("TERMINATED", "ERROR"),
        ("ERROR", "ACTIVE"),
    ],
)
def test_lease_refuses_skipping_or_reversing_its_life(current: str, new: str) -> None:
    with pytest.raises(Conflict, match=f"from {current} to {new}"):
        check_lease_transition(current, LeaseStatus(new))


FINAL = {LeaseStatus.TERMINATED, LeaseStatus.TIMEDOUT, LeaseStatus.EXPIRED}


def test_every_status_has_a_row_and_only_ended_ones_are_final() -> None:
    assert set(LEASE_TRANSITIONS) == set(LeaseStatus)
    assert {s for s, nexts in LEASE_TRANSITIONS.items() if not nexts} == FINAL
    assert set(RESERVATION_TRANSITIONS) == set(ReservationStatus)
    assert set(EVENT_TRANSITIONS) == set(EventStatus)
    assert not EVENT_TRANSITIONS[EventStatus.DONE]


def test_every_non_final_lease_status_can_reach_terminated() -> None:
    for start in set(LeaseStatus) - FINAL:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in LEASE_TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert LeaseStatus.TERMINATED in seen, start


@pytest.mark.parametrize(
    "path",
    [
        ["IN_PROGRESS", "PENDING", "STARTING", "ACTIVE"],  # a waiting lease admitted
        ["IN_PROGRESS", "TIMEDOUT"],  # best effort, deadline passed
        ["IN_PROGRESS", "ERROR"],  # retry, attempts exhausted
        ["IN_PROGRESS", "TERMINATED"],  # deleted while waiting
        ["HELD", "PENDING", "STARTING"],  # a hold confirmed
        ["HELD", "EXPIRED"],  # a hold lapsed
        ["HELD", "TERMINATED"],  # a hold deleted
    ],
)
def test_waiting_and_held_leases_move_on_by_these_paths(path: list[str]) -> None:
    for current, new in zip(path, path[1:], strict=False):
        check_lease_transition(current, LeaseStatus(new))


@pytest.mark.parametrize(
    ("current", "new"),
    [
        ("IN_PROGRESS", "ACTIVE"),  # admitted first, then started by its start event
        ("HELD", "ACTIVE"),  # a hold never starts unconfirmed
        ("HELD", "TIMEDOUT"),
        ("TIMEDOUT", "PENDING"),
        ("EXPIRED", "PENDING"),  # a lapsed hold cannot be confirmed
        ("PENDING", "HELD"),
    ],
)
def test_waiting_and_held_leases_refuse_these(current: str, new: str) -> None:
    with pytest.raises(Conflict, match=f"from {current} to {new}"):
        check_lease_transition(current, LeaseStatus(new))


def test_reservation_and_event_rules() -> None:
    check_reservation_transition("pending", ReservationStatus.ACTIVE)
    check_reservation_transition("error", ReservationStatus.DELETED)
    with pytest.raises(Conflict):
        check_reservation_transition("deleted", ReservationStatus.ACTIVE)
    check_event_transition("IN_PROGRESS", EventStatus.UNDONE)  # a retry
    with pytest.raises(Conflict):
        check_event_transition("DONE", EventStatus.IN_PROGRESS)  # never twice
