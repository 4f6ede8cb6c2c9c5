"""The power policy (docs/power.md): hosts with nothing allocated for ``power_idle_hours`` are
powered down through the backend and woken ``power_wake_lead_seconds`` ahead of their next
lease; a host that fails to wake is a failed host (healing moves its reservations). The
manager's start of a lease wakes any host of it still powered down first (``wake_for_start``),
so no lease ever starts on a sleeping host, whatever the timing of the passes."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from climate.backends.base import Action, PowerOff, PowerOn, Result, Timeboxed
from climate.context import ServiceContext
from climate.db import audit
from climate.db import power as power_rows
from climate.domain.actor import Actor
from climate.errors import InvalidInput
from climate.notify import enqueue_host
from climate.planner.power import PowerPlan, hours_off, plan_power
from climate.services.healing import HealingService

LOG = logging.getLogger(__name__)
ACTOR = "manager"
HOUR = dt.timedelta(hours=1)


@dataclass(frozen=True)
class HostPowerState:
    id: int
    name: str
    state: str
    """``on``, ``off`` (powered down by the policy) or ``down`` (failed; left alone)."""
    off_since: dt.datetime | None
    next_lease_start: dt.datetime | None
    """When its next allocation starts, if within the idle horizon (or already under way)."""
    idle: bool
    """On, and nothing allocated within ``power_idle_hours``: the policy's candidate."""


@dataclass(frozen=True)
class PowerReport:
    policy: str
    idle_hours: float
    wake_lead_seconds: float
    host_watts: float
    hosts: list[HostPowerState]
    start: dt.datetime
    end: dt.datetime
    hours_off: dict[int, float]

    @property
    def saved_host_hours(self) -> float:
        return sum(self.hours_off.values())

    @property
    def saved_kwh(self) -> float:
        return self.saved_host_hours * self.host_watts / 1000.0


class PowerService:
    def __init__(self, ctx: ServiceContext, backend: Timeboxed) -> None:
        self.ctx = ctx
        self.backend = backend

    @property
    def _idle(self) -> dt.timedelta:
        return dt.timedelta(hours=self.ctx.settings.power_idle_hours)

    @property
    def _wake_ahead(self) -> dt.timedelta:
        settings = self.ctx.settings
        # One pass may come up to an interval late: wake at the last pass before the lead.
        return dt.timedelta(
            seconds=settings.power_wake_lead_seconds + settings.power_interval_seconds
        )

    # -- what the API shows ------------------------------------------------------------------

    def report(
        self, actor: Actor, start: dt.datetime | None, end: dt.datetime | None
    ) -> PowerReport:
        """Each host's power state and the policy's candidates now; the host-hours powered
        down within [start, end) (default: the last 30 days) and the energy that saved."""
        self.ctx.policy.enforce(actor, "blazar:oshosts:get")
        now = self.ctx.clock.now()
        end = end or now
        start = start or end - dt.timedelta(days=30)
        if end <= start:
            raise InvalidInput("end", "must be later than start")
        if end - start > dt.timedelta(days=self.ctx.settings.availability_max_days):
            raise InvalidInput(
                "end", f"a period is at most {self.ctx.settings.availability_max_days} days long"
            )
        with self.ctx.db.reader() as session:
            hosts = power_rows.hosts(session)
            busy = power_rows.next_busy(session, now, now + self._idle)
            periods = power_rows.off_periods(session, start, end)
        plan = self._plan(hosts, busy, now)
        states = [
            HostPowerState(
                h.id,
                h.name,
                "down" if h.down else ("off" if h.off_since is not None else "on"),
                h.off_since,
                busy.get(h.id),
                h.id in plan.power_off,
            )
            for h in hosts
        ]
        settings = self.ctx.settings
        return PowerReport(
            settings.power_policy,
            settings.power_idle_hours,
            settings.power_wake_lead_seconds,
            settings.power_host_watts,
            states,
            start,
            end,
            hours_off(periods, start, end, now),
        )

    def _plan(
        self,
        hosts: Sequence[power_rows.PowerHost],
        busy: Mapping[int, dt.datetime],
        now: dt.datetime,
    ) -> PowerPlan:
        on = [h.id for h in hosts if not h.down and h.off_since is None]
        off = [h.id for h in hosts if h.off_since is not None]
        return plan_power(on, off, busy, now, self._idle, self._wake_ahead)

    # -- the manager's pass ------------------------------------------------------------------

    def run(self) -> PowerPlan:
        """Power down the idle hosts and wake those whose lease comes near (policy ``act``);
        with the policy ``off`` or ``report``, wake every host still powered down."""
        now = self.ctx.clock.now()
        horizon = now + max(self._idle, self._wake_ahead)
        with self.ctx.db.reader() as session:
            hosts = power_rows.hosts(session)
            if self.ctx.settings.power_policy == "act":
                plan = self._plan(hosts, power_rows.next_busy(session, now, horizon), now)
            else:
                plan = PowerPlan((), tuple(h.id for h in hosts if h.off_since is not None))
        if not plan.power_off and not plan.wake:
            return plan
        names = {h.id: h.name for h in hosts}
        reason = f"no lease for {self.ctx.settings.power_idle_hours:g} h"
        actions: list[Action] = [PowerOff(str(h), names[h], reason) for h in plan.power_off]
        actions += [PowerOn(str(h), names[h]) for h in plan.wake]
        results = self.backend.handle(actions)
        failed_wakes: list[tuple[int, BaseException]] = []
        with self.ctx.db.transaction() as session:
            for host_id, result in zip(plan.power_off, results, strict=False):
                if isinstance(result, BaseException):
                    LOG.warning("host %s did not power down: %s", names[host_id], result)
                else:
                    self._record(session, "power_off", host_id, names[host_id], now, reason)
            for host_id, result in zip(plan.wake, results[len(plan.power_off) :], strict=True):
                if isinstance(result, BaseException):
                    failed_wakes.append((host_id, result))
                else:
                    self._record(session, "power_on", host_id, names[host_id], now)
        healing = HealingService(self.ctx, self.backend)
        for host_id, exc in failed_wakes:
            LOG.warning("host %s did not wake: %s; marking it down", names[host_id], exc)
            healing.mark_down(ACTOR, str(host_id), f"did not wake from power saving: {exc}")
        return plan

    # -- the manager's start of a lease ------------------------------------------------------

    def wake_for_start(
        self, session: Session, hosts: Mapping[int, str], now: dt.datetime
    ) -> dict[int, BaseException]:
        """Wake those of ``hosts`` (id -> name) still powered down, in the transaction that
        starts their lease; returns the hosts that failed to wake (that start must wait: the
        next pass marks such a host down and healing replaces it)."""
        asleep = power_rows.off_among(session, list(hosts))
        if not asleep:
            return {}
        results: Sequence[Result] = self.backend.handle([PowerOn(str(h), hosts[h]) for h in asleep])
        failed: dict[int, BaseException] = {}
        for host_id, result in zip(asleep, results, strict=True):
            if isinstance(result, BaseException):
                failed[host_id] = result
            else:
                self._record(session, "power_on", host_id, hosts[host_id], now)
        return failed

    def _record(
        self,
        session: Session,
        action: str,
        host_id: int,
        name: str,
        now: dt.datetime,
        reason: str | None = None,
    ) -> None:
        if action == "power_off":
            power_rows.powered_off(session, host_id, now)
        else:
            power_rows.powered_on(session, host_id, now)
        detail: dict[str, object] = {"name": name}
        if reason is not None:
            detail["reason"] = reason
        audit.record(
            session,
            at=now,
            actor=ACTOR,
            action=f"host.{action}",
            target_type="host",
            target_id=str(host_id),
            detail=detail,
        )
        enqueue_host(
            self.ctx.settings, session, f"host.{action}", {"id": str(host_id), **detail}, now
        )
