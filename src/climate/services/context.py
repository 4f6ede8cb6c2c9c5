"""What every service needs, built once at the entry point."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from climate.config import Settings
from climate.db import leases as lease_rows
from climate.db.engine import Database
from climate.domain.clock import Clock
from climate.errors import InvalidInput
from climate.policy import Policy, load_policy
from climate.resources.base import ResourceType


def _nothing(_earliest: dt.datetime) -> None:
    return None


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    clock: Clock
    resource_types: dict[str, ResourceType]
    wake_manager: Callable[[dt.datetime], None] = field(default=_nothing)
    """Called after a commit that added or moved events, with the earliest of them (an
    in-process manager wakes at once if that is before what it is waiting for)."""
    policy: Policy = field(init=False)
    """The defaults with the operator's ``policy_file`` on top; a bad file fails here."""

    def __post_init__(self) -> None:
        self.policy = load_policy(self.settings.admin_role, self.settings.policy_file)
        for resource_type in self.resource_types.values():
            resource_type.configure(self.settings)

    def events_changed(self, session: Session, earliest: dt.datetime) -> None:
        """Events now wait from ``earliest`` on: at commit, tell the managers of other processes
        (NOTIFY) and of this one."""
        lease_rows.signal_event_change(session, earliest)
        session.info.setdefault("on_commit", []).append(lambda: self.wake_manager(earliest))


@dataclass(frozen=True)
class Page:
    """Which slice of a list to return: at most ``limit`` items after the one with id
    ``marker``, in ``sort_key`` order (``sort_dir`` "asc" or "desc"), ties broken by id."""

    limit: int | None = None
    marker: str | None = None
    sort_key: str | None = None
    sort_dir: str = "asc"

    def size(self, cap: int) -> int:
        """The page size: ``limit`` clamped to ``cap`` (the ``max_page_size`` setting)."""
        return cap if self.limit is None else min(self.limit, cap)

    def key(self, allowed: tuple[str, ...]) -> str:
        """The sort key, the first of ``allowed`` by default.

        :raises InvalidInput: a key not in ``allowed``.
        """
        if self.sort_key is None:
            return allowed[0]
        if self.sort_key not in allowed:
            raise InvalidInput("sort_key", f"must be one of {', '.join(allowed)}")
        return self.sort_key


FIRST_PAGE = Page()
"""The first ``max_page_size`` items in the default order."""
