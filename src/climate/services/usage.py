"""Usage and billing: reserved and really used unit-hours per project over a period, priced by
the service's price table (``climate.pricing``).

*Reserved* is each allocation's window as it stands (an early delete cuts it, docs/architecture.md)
within the period. *Used* is the same window cut to the lease's real life: from when its start
event was done to when its end event was done (or now, while it runs); a lease that never
started used nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from climate import pricing
from climate.context import ServiceContext
from climate.db import billing as usage_rows
from climate.domain.actor import Actor
from climate.errors import InvalidInput
from climate.fairshare.credits import measures
from climate.pricing import PriceTable

PERIODS = ("day", "month")
_MICROSECONDS_PER_HOUR = 3_600_000_000
_ONE = dt.timedelta(microseconds=1)
HOURS = Decimal("0.000001")
"""Unit-hours are shown to the millionth (amounts are computed from the exact hours)."""


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    end: dt.datetime
    period: Literal["day", "month", "custom"]


def window(
    period: str | None,
    start: dt.datetime | None,
    end: dt.datetime | None,
    now: dt.datetime,
    max_days: int,
) -> Window:
    """The period asked for: the UTC day or month holding ``start`` (default: now), or the
    custom range [start, end). Nothing given: this month.

    :raises InvalidInput: an unknown period, an end with a period, a custom range without both
        ends, inverted, or longer than ``max_days`` (the field is named)."""
    if period is None and start is None and end is None:
        period = "month"
    if period is not None:
        if period not in PERIODS:
            raise InvalidInput("period", f"must be one of {', '.join(PERIODS)}, not {period!r}")
        if end is not None:
            raise InvalidInput("end", "not with a period: give start and end, or period and start")
        at = (start or now).astimezone(dt.UTC)
        first = dt.datetime(at.year, at.month, 1 if period == "month" else at.day, tzinfo=dt.UTC)
        if period == "day":
            return Window(first, first + dt.timedelta(days=1), "day")
        following = dt.datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=dt.UTC)
        return Window(first, following, "month")
    if start is None:
        raise InvalidInput("start", "a custom period needs start and end (or give period)")
    if end is None:
        raise InvalidInput("end", "a custom period needs start and end (or give period)")
    if end <= start:
        raise InvalidInput("end", "must be after start")
    if end - start > dt.timedelta(days=max_days):
        raise InvalidInput("end", f"the period may cover at most {max_days} days")
    return Window(start, end, "custom")


@dataclass(frozen=True)
class UsageLine:
    resource_type: str
    unit: str
    rule: str
    """The price table's rule that priced these hours (``""``: none, free)."""
    price: Decimal
    reserved: Decimal
    used: Decimal
    """Unit-hours (exact; shown to the millionth)."""
    reserved_amount: Decimal
    used_amount: Decimal


@dataclass(frozen=True)
class ProjectUsage:
    project_id: str
    lines: list[UsageLine]

    @property
    def reserved_amount(self) -> Decimal:
        return sum((line.reserved_amount for line in self.lines), Decimal("0.00"))

    @property
    def used_amount(self) -> Decimal:
        return sum((line.used_amount for line in self.lines), Decimal("0.00"))


@dataclass(frozen=True)
class Usage:
    window: Window
    projects: list[ProjectUsage]


class UsageService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.prices = PriceTable.parse(ctx.settings.prices)
        self.measures = measures(ctx.resource_types)

    def report(self, actor: Actor, asked: Window, project_id: str | None = None) -> Usage:
        """Usage over ``asked`` of ``project_id``, or of the caller's project; an admin who
        names none sees every project.

        :raises Forbidden: a member names another project."""
        scope = self.ctx.policy.scope(actor)
        wanted = project_id if project_id is not None else scope
        self.ctx.policy.enforce(
            actor, "climate:usage:get", {"project_id": wanted or actor.project_id}
        )
        now = self.ctx.clock.now()
        with self.ctx.db.reader() as session:
            held = list(usage_rows.held(session, asked.start, asked.end, wanted))
            ids: dict[str, set[int]] = defaultdict(set)
            for h in held:
                ids[h.table].add(h.resource)
            props = {
                table: usage_rows.properties(session, table, found) for table, found in ids.items()
            }
        return Usage(asked, self._lines(held, props, asked, now))

    def _lines(
        self,
        held: Iterable[usage_rows.Held],
        props: dict[str, dict[int, dict[str, str]]],
        asked: Window,
        now: dt.datetime,
    ) -> list[ProjectUsage]:
        # (project, type, rule) -> [reserved, used] in unit-microseconds, and the rate and divisor
        totals: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        rates: dict[tuple[str, str, str], tuple[Decimal, int]] = {}
        known: dict[tuple[str, str, int], pricing.Rate] = {}
        for h in held:
            reserved = _overlap(h.start, h.end, asked.start, asked.end)
            used = 0
            if h.started is not None:
                until = min(h.end, h.ended or now)
                used = _overlap(max(h.start, h.started), until, asked.start, asked.end)
            for resource_type, index, divisor in self.measures.get(h.table, ()):
                rate_key = (resource_type, h.table, h.resource)
                rate = known.get(rate_key)
                if rate is None:
                    rate = known[rate_key] = self.prices.rate(
                        resource_type, props[h.table].get(h.resource, {})
                    )
                key = (h.project_id, resource_type, rate.rule)
                rates[key] = (rate.price, divisor)
                totals[key][0] += h.amounts[index] * reserved
                totals[key][1] += h.amounts[index] * used
        projects: dict[str, list[UsageLine]] = defaultdict(list)
        for key in sorted(totals):
            project, resource_type, rule = key
            price, divisor = rates[key]
            reserved_hours, used_hours = (
                Decimal(t) / (_MICROSECONDS_PER_HOUR * divisor) for t in totals[key]
            )
            projects[project].append(
                UsageLine(
                    resource_type,
                    pricing.UNITS[resource_type],
                    rule,
                    price,
                    reserved_hours,
                    used_hours,
                    pricing.cost(price, reserved_hours),
                    pricing.cost(price, used_hours),
                )
            )
        return [ProjectUsage(p, lines) for p, lines in sorted(projects.items())]


def _overlap(a: dt.datetime, b: dt.datetime, c: dt.datetime, d: dt.datetime) -> int:
    """Microseconds [a, b) and [c, d) have in common."""
    return max(0, (min(b, d) - max(a, c)) // _ONE)
