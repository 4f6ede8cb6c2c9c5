"""Is this Climate ready to serve, and the state its metrics show: read from the database at
each call, cheaply (indexed counts and aggregates)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.exc import SQLAlchemyError

from climate.context import ServiceContext
from climate.db import managers, ops
from climate.db.ops import last_heartbeat

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    name: Literal["database", "manager", "outbox"]
    ok: bool
    detail: str


@dataclass(frozen=True)
class State:
    leases: dict[tuple[str, ...], int]
    """Live leases by (status,), or by (project, status) when asked for."""
    outbox_backlog: int
    dead_letters: int
    heartbeat_age: float | None
    """Seconds since a manager last showed it is alive; None: none ever did."""


class HealthService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def readiness(self) -> list[Check]:
        """The database answers, a manager's heartbeat is fresher than ``manager_dead_seconds``,
        and the outbox holds at most ``ready_max_outbox_backlog`` undelivered notifications.
        With the database unreachable the other two are not looked at."""
        settings = self.ctx.settings
        try:
            with self.ctx.db.reader() as session:
                ops.ping(session)
                backlog = ops.outbox_backlog(session)
            age = self._heartbeat_age()
        except SQLAlchemyError as exc:
            LOG.warning("readiness: the database does not answer: %s", exc)
            return [Check("database", False, f"unreachable: {type(exc).__name__}")]
        stale = settings.manager_dead_seconds
        if age is None:
            manager = Check("manager", False, "no manager has ever run on this database")
        elif age > stale:
            manager = Check("manager", False, f"last heartbeat {age:.1f} s ago (over {stale:g} s)")
        else:
            manager = Check("manager", True, f"last heartbeat {age:.1f} s ago")
        limit = settings.ready_max_outbox_backlog
        outbox = Check(
            "outbox",
            backlog <= limit,
            f"{backlog} undelivered notification(s)"
            + ("" if backlog <= limit else f" (over {limit})"),
        )
        return [Check("database", True, "reachable"), manager, outbox]

    def state(self, *, by_project: bool = False) -> State:
        with self.ctx.db.reader() as session:
            leases = ops.lease_counts(session, by_project=by_project)
            backlog = ops.outbox_backlog(session)
            dead = ops.dead_letters(session)
        return State(leases, backlog, dead, self._heartbeat_age())

    def _heartbeat_age(self) -> float | None:
        beat = last_heartbeat(self.ctx.db)
        if beat is None:
            return None
        return max(0.0, (managers.wall_now() - beat).total_seconds())
