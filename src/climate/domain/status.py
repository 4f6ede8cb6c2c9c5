"""Statuses and the transition tables: the one place that says which status may follow which."""

from __future__ import annotations

import enum

from climate.errors import Conflict


class LeaseStatus(enum.StrEnum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    ACTIVE = "ACTIVE"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    IN_PROGRESS = "IN_PROGRESS"
    """A retry or best-effort lease waiting for capacity (the seeds' in_progress)."""
    TIMEDOUT = "TIMEDOUT"
    """A best-effort lease that found no capacity before its deadline."""
    HELD = "HELD"
    """A hold: resources allocated, waiting for confirmation."""
    EXPIRED = "EXPIRED"
    """A hold that lapsed unconfirmed; its resources went back."""
    DELETING = "DELETING"
    """Deleted; its resources are being taken back (Blazar's DELETING). A lease that had not
    started is TERMINATED at once; a running one stays DELETING until the manager ended it."""


class LeaseType(enum.StrEnum):
    SCHEDULED = "scheduled"
    IMMEDIATE = "immediate"
    RETRY = "retry"
    BEST_EFFORT = "best_effort"


class ReservationStatus(enum.StrEnum):
    PENDING = "pending"
    ACTIVE = "active"
    DELETED = "deleted"
    ERROR = "error"


class EventStatus(enum.StrEnum):
    UNDONE = "UNDONE"
    IN_PROGRESS = "IN_PROGRESS"
    DONE = "DONE"
    ERROR = "ERROR"


class EventType(enum.StrEnum):
    START_LEASE = "start_lease"
    END_LEASE = "end_lease"
    BEFORE_END_LEASE = "before_end_lease"


# Events of different leases due at the same instant run in this order: a host freed by one
# lease's end is free again before another lease starts on it.
EVENT_ORDER: dict[EventType, int] = {
    EventType.END_LEASE: 0,
    EventType.START_LEASE: 1,
    EventType.BEFORE_END_LEASE: 2,
}

# Events of one lease run in its life's order, whatever their times: an event waits until every
# earlier one of its lease is DONE or ERROR (so two managers cannot end a lease before it starts).
LIFECYCLE_ORDER: dict[EventType, int] = {
    EventType.START_LEASE: 0,
    EventType.BEFORE_END_LEASE: 1,
    EventType.END_LEASE: 2,
}

LEASE_TRANSITIONS: dict[LeaseStatus, frozenset[LeaseStatus]] = {
    LeaseStatus.PENDING: frozenset(
        {LeaseStatus.STARTING, LeaseStatus.TERMINATED, LeaseStatus.DELETING}
    ),
    # STARTING -> TERMINATING: the end came while a failed start was still being retried.
    LeaseStatus.STARTING: frozenset(
        {LeaseStatus.ACTIVE, LeaseStatus.ERROR, LeaseStatus.TERMINATING, LeaseStatus.DELETING}
    ),
    LeaseStatus.ACTIVE: frozenset(
        {LeaseStatus.TERMINATING, LeaseStatus.ERROR, LeaseStatus.DELETING}
    ),
    LeaseStatus.TERMINATING: frozenset(
        {LeaseStatus.TERMINATED, LeaseStatus.ERROR, LeaseStatus.DELETING}
    ),
    LeaseStatus.TERMINATED: frozenset(),
    LeaseStatus.ERROR: frozenset(
        {LeaseStatus.TERMINATING, LeaseStatus.TERMINATED, LeaseStatus.DELETING}
    ),
    # IN_PROGRESS -> ERROR: a retry lease's last attempt failed.
    LeaseStatus.IN_PROGRESS: frozenset(
        {
            LeaseStatus.PENDING,
            LeaseStatus.TIMEDOUT,
            LeaseStatus.ERROR,
            LeaseStatus.TERMINATED,
            LeaseStatus.DELETING,
        }
    ),
    LeaseStatus.TIMEDOUT: frozenset(),
    LeaseStatus.HELD: frozenset(
        {LeaseStatus.PENDING, LeaseStatus.EXPIRED, LeaseStatus.TERMINATED, LeaseStatus.DELETING}
    ),
    LeaseStatus.EXPIRED: frozenset(),
    # A deleted lease's end (by the manager) runs in DELETING: no TERMINATING in between.
    LeaseStatus.DELETING: frozenset({LeaseStatus.TERMINATED, LeaseStatus.ERROR}),
}

RESERVATION_TRANSITIONS: dict[ReservationStatus, frozenset[ReservationStatus]] = {
    ReservationStatus.PENDING: frozenset(
        {ReservationStatus.ACTIVE, ReservationStatus.DELETED, ReservationStatus.ERROR}
    ),
    ReservationStatus.ACTIVE: frozenset({ReservationStatus.DELETED, ReservationStatus.ERROR}),
    ReservationStatus.DELETED: frozenset(),
    ReservationStatus.ERROR: frozenset({ReservationStatus.DELETED}),
}

EVENT_TRANSITIONS: dict[EventStatus, frozenset[EventStatus]] = {
    EventStatus.UNDONE: frozenset({EventStatus.IN_PROGRESS}),
    # IN_PROGRESS -> UNDONE: a failed attempt that will be retried, or a claim that expired.
    EventStatus.IN_PROGRESS: frozenset({EventStatus.DONE, EventStatus.ERROR, EventStatus.UNDONE}),
    EventStatus.DONE: frozenset(),
    # ERROR -> UNDONE: an operator asked to retry.
    EventStatus.ERROR: frozenset({EventStatus.UNDONE}),
}

# A lease that has not started may change its start; one that has ended may not change at all.
LEASE_EDITABLE = frozenset({LeaseStatus.PENDING, LeaseStatus.ACTIVE})


def check_lease_transition(current: str, new: LeaseStatus) -> None:
    """Raise Conflict unless ``current -> new`` is allowed for a lease."""
    if new not in LEASE_TRANSITIONS[LeaseStatus(current)]:
        raise Conflict(f"lease cannot go from {current} to {new}")


def check_reservation_transition(current: str, new: ReservationStatus) -> None:
    """Raise Conflict unless ``current -> new`` is allowed for a reservation."""
    if new not in RESERVATION_TRANSITIONS[ReservationStatus(current)]:
        raise Conflict(f"reservation cannot go from {current} to {new}")


def check_event_transition(current: str, new: EventStatus) -> None:
    """Raise Conflict unless ``current -> new`` is allowed for an event."""
    if new not in EVENT_TRANSITIONS[EventStatus(current)]:
        raise Conflict(f"event cannot go from {current} to {new}")


class StartPolicy(enum.StrEnum):
    """What a reservation's start does with the project's workload (docs/policies.md)."""

    AUTO = "auto"
    """The backend hands the resources over and starts the workload."""
    MANUAL = "manual"
    """The backend only holds the resources for the project, which starts them itself."""


class EndPolicy(enum.StrEnum):
    """What a reservation's end does with the project's workload (docs/policies.md). The
    resources go back to the pool at the end whatever the policy."""

    RELEASE = "release"
    DELETE = "delete"
    SUSPEND = "suspend"
    SNAPSHOT = "snapshot"
    KEEP_UNTIL_ACK = "keep-until-ack"
