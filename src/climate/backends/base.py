"""The backend interface: one small class, called by the manager inside the event's transaction."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Handover:
    """What a backend needs to hand resources to a project, or take them back."""

    lease_id: str
    reservation_id: str
    project_id: str
    resource_type: str
    resource_ids: tuple[str, ...]
    at: dt.datetime


Outcome = BaseException | None
"""Per item of a batch: None when it succeeded, else the exception that made it fail."""

_Step = TypeVar("_Step")


class Backend(abc.ABC):
    """Side effects in the world when reservations start, near their end, and end.

    Every method must be idempotent: the manager may call it again for the same handover after
    a crash or a failed attempt, and the second call must not hand out resources twice. Raise any
    exception to report a failure; the manager retries with backoff and finally marks the event
    and the lease ERROR with the exception's message.

    ``session`` is the event's transaction: a backend that only records (standalone) writes there,
    so that its record and the lease status commit together.

    The manager runs the events due together in batches and calls the ``*_batch`` methods, one
    item per event (the handovers of that event's lease). Their default implementations call the
    per-handover methods, each item in a savepoint of its own, so a backend needs only the three
    abstract methods; one that can do a batch's work in bulk overrides the ``*_batch`` methods.
    """

    name: str = "base"

    @abc.abstractmethod
    def start(self, session: Session, handover: Handover) -> None:
        """Hand the resources to the project."""

    @abc.abstractmethod
    def before_end(self, session: Session, handover: Handover, action: str) -> None:
        """Run the reservation's ``before_end`` action (``default`` does nothing)."""

    @abc.abstractmethod
    def end(self, session: Session, handover: Handover) -> None:
        """Take the resources back from the project."""

    # -- batches -----------------------------------------------------------------------------

    def start_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """``start`` every handover of every item; returns one outcome per item.

        An override must keep items apart: a failed item leaves nothing behind and does not
        fail the others (report it in its outcome). It may also raise, failing the whole batch:
        the manager then rolls the batch back and calls again with one item at a time.
        """
        return each_in_savepoint(session, items, lambda h: self.start(session, h))

    def before_end_batch(
        self, session: Session, items: Sequence[Sequence[tuple[Handover, str]]]
    ) -> list[Outcome]:
        """``before_end`` for every (handover, action) of every item; as ``start_batch``."""
        return each_in_savepoint(session, items, lambda step: self.before_end(session, *step))

    def end_batch(self, session: Session, items: Sequence[Sequence[Handover]]) -> list[Outcome]:
        """``end`` every handover of every item; as ``start_batch``."""
        return each_in_savepoint(session, items, lambda h: self.end(session, h))


def each_in_savepoint(
    session: Session, items: Sequence[Sequence[_Step]], call: Callable[[_Step], None]
) -> list[Outcome]:
    """``call`` each step of each item, an item per savepoint: a failing item is rolled back
    alone and its exception is its outcome."""
    outcomes: list[Outcome] = []
    for item in items:
        try:
            with session.begin_nested():
                for step in item:
                    call(step)
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes
