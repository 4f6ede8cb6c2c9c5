"""The backend interface: one small class, called by the manager inside the event's transaction."""

from __future__ import annotations

import abc
import datetime as dt
from dataclasses import dataclass

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


class Backend(abc.ABC):
    """Side effects in the world when reservations start, near their end, and end.

    Every method must be idempotent: the manager may call it again for the same handover after
    a crash or a failed attempt, and the second call must not hand out resources twice. Raise any
    exception to report a failure; the manager retries with backoff and finally marks the event
    and the lease ERROR with the exception's message.

    ``session`` is the event's transaction: a backend that only records (standalone) writes there,
    so that its record and the lease status commit together.
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
