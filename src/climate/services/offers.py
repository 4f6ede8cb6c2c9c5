"""What happens around admission: why a lease was refused and what would fit instead
(counter-offers), flexible windows, and dry runs (docs/admission.md).

Refusals are explained after the refused transaction has rolled back, from a reader session and
the in-memory calendar, as the availability search reads it: no admission lock is held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from climate import wire
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.planner.availability import (
    CounterOffer,
    SearchRange,
    Shortfall,
    counter_offers,
    earliest,
)
from climate.planner.calendar import moment, seconds
from climate.resources import pick
from climate.services.context import ServiceContext
from climate.services.placing import placers, searchable

if TYPE_CHECKING:
    from climate.db.tables import Lease
    from climate.domain.actor import Actor
    from climate.services.leases import LeaseRequest, LeaseService

OFFER_STEP = 60
"""Later starts are offered on whole minutes (what the blazar CLI can type)."""
SHORTEST_OFFER = 60.0
"""A shorter lease is offered only if it lasts at least this many seconds."""
FLEXIBLE_ATTEMPTS = 3
"""A flexible lease whose chosen window is taken meanwhile is placed again this many times."""


class DryRun(Exception):
    """Raised at the end of a dry run's transaction: everything it wrote is rolled back."""


@dataclass(frozen=True)
class Offer:
    kind: str
    """``later_start``, ``fewer_hosts`` or ``shorter`` (``CounterOffer``)."""
    start: dt.datetime
    end: dt.datetime
    counts: tuple[tuple[int, int], ...]
    """(min, max) per reservation, in request order."""
    below_request: bool


@dataclass(frozen=True)
class Refusal:
    start: dt.datetime
    end: dt.datetime
    shortfalls: tuple[Shortfall, ...]
    """For reservations whose type can be searched (every built-in type), in its units: hosts,
    items, instances of its size, volume GB."""
    unexplained: tuple[tuple[int, str], ...]
    """(index, resource type) of the others."""
    offers: tuple[Offer, ...]


@contextlib.contextmanager
def explaining(
    ctx: ServiceContext,
    request: LeaseRequest,
    start: dt.datetime,
    params: Sequence[Mapping[str, Any]],
) -> Iterator[None]:
    """Adds the reason and counter-offers to a ``NotEnoughCapacity`` raised inside (once the
    transaction inside has rolled back)."""
    try:
        yield
    except NotEnoughCapacity as refused:
        if refused.details is None:
            refusal = explain(ctx, request, start, request.end, params)
            refused.details = wire.refusal(refusal, request, params)
        raise


def explain(
    ctx: ServiceContext,
    request: LeaseRequest,
    start: dt.datetime,
    end: dt.datetime,
    params: Sequence[Mapping[str, Any]],
) -> Refusal:
    """Why the reservations of ``request`` do not fit in [start, end), and up to three offers
    that would: the earliest later start (within ``offer_search_days``), the most resources that
    fit in the window, the longest lease from ``start``. Offers are made only when every
    reservation's type can be searched."""
    types = [ctx.resource_types[str(r.resource_type)] for r in request.reservations]
    unexplained = tuple((i, t.name) for i, t in enumerate(types) if not searchable(t))
    begin, finish = seconds(start), seconds(end)
    duration = math.ceil(finish - begin)
    horizon = ctx.settings.offer_search_days * 86_400
    search = SearchRange(
        math.ceil(begin), math.floor(begin) + horizon + duration, duration, OFFER_STEP
    )
    by_type: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for i, (rtype, p) in enumerate(zip(types, params, strict=True)):
        if searchable(rtype):
            by_type.setdefault(rtype.name, []).append((i, p))
    offers: list[Offer] = []
    with (
        ctx.db.reader() as session,
        placers(ctx.resource_types, session, by_type, search) as found_placers,
    ):
        if unexplained:
            shortfalls = sorted(
                (s for p in found_placers for s in p.explain(begin, finish)),
                key=lambda s: s.index,
            )
            found: list[CounterOffer] = []
        else:
            shortfalls, found = counter_offers(found_placers, search, begin, finish, SHORTEST_OFFER)
    asked = tuple(_counts(p) for p in params)
    for o in found:
        # The request's own start, exactly (it may be "now"), unless the offer moves it.
        at = start if o.start == begin else moment(o.start)
        until = moment(o.end) if o.kind == "shorter" else at + (end - start)
        counts = asked
        if o.counts is not None:
            # Volumes count GB in the planner: only reducible reservations change their counts.
            counts = tuple(
                cut if s.reducible else own
                for cut, own, s in zip(o.counts, asked, shortfalls, strict=True)
            )
        offers.append(Offer(o.kind, at, until, counts, o.below_request))
    return Refusal(start, end, tuple(shortfalls), unexplained, tuple(offers))


def _counts(params: Mapping[str, Any]) -> tuple[int, int]:
    """A reservation's (min, max) as asked: ``amount`` for types counted by it."""
    if "min" in params:
        return int(params["min"]), int(params["max"])
    amount = int(params.get("amount", 0))
    return amount, amount


def create_flexible(
    service: LeaseService, actor: Actor, request: LeaseRequest, length: dt.timedelta
) -> Lease:
    """Create ``request`` at the earliest start in [request.start, request.end] where a lease of
    ``length`` fits, as the availability search finds it; if that window is taken
    before it is admitted, search again (``FLEXIBLE_ATTEMPTS`` in all).

    :raises InvalidInput: a field is wrong (named in the message).
    :raises NotEnoughCapacity: no window fits, with the reason at the earliest start and offers.
    """
    ctx = service.ctx
    now = ctx.clock.now()
    duration = math.ceil(length.total_seconds())
    if duration <= 0:
        raise InvalidInput("duration", f"must be positive, not {length.total_seconds()} seconds")
    if request.before_end is not None:
        raise InvalidInput("before_end_date", "cannot be given with a flexible window")
    start = now if request.start is None else max(request.start, now)
    longest_range = dt.timedelta(days=ctx.settings.availability_max_days)
    if length > longest_range:
        raise InvalidInput("duration", f"may be at most {longest_range.days} days")
    if request.end < start + length:
        raise InvalidInput(
            "latest_end",
            f"{request.end.isoformat()} leaves no room for {duration} seconds after "
            f"earliest_start {start.isoformat()}",
        )
    if request.end - start > longest_range:
        raise InvalidInput(
            "latest_end", f"may be at most {longest_range.days} days after earliest_start"
        )
    if not request.reservations:
        raise InvalidInput("reservations", "a lease needs at least one reservation")
    by_type: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    params: list[Mapping[str, Any]] = []
    for i, r in enumerate(request.reservations):
        field = f"reservations[{i}]"
        rtype = pick(ctx.resource_types, r.resource_type, f"{field}.resource_type")
        params.append(rtype.validate(r.fields, None, field))
        if not searchable(rtype):
            raise InvalidInput(
                f"{field}.resource_type", f"{rtype.name} cannot be placed in a flexible window"
            )
        by_type.setdefault(rtype.name, []).append((i, params[-1]))

    def chosen() -> LeaseRequest:
        """The request with the earliest window that fits now."""
        search = SearchRange(
            math.ceil(seconds(max(start, ctx.clock.now()))),
            math.floor(seconds(request.end)),
            duration,
            1,
        )
        with (
            ctx.db.reader() as session,
            placers(ctx.resource_types, session, by_type, search) as found_placers,
        ):
            found = earliest(found_placers, search, 1)
        if not found:
            refused = NotEnoughCapacity(
                f"no window of {duration} seconds fits between {start.isoformat()} and "
                f"{request.end.isoformat()}"
            )
            refusal = explain(ctx, request, start, start + length, params)
            refused.details = wire.refusal(refusal, request, params)
            raise refused
        window = found[0]
        return dataclasses.replace(
            request, start=moment(window.start), end=moment(window.end), duration=None
        )

    for _ in range(FLEXIBLE_ATTEMPTS - 1):
        fixed = chosen()
        with contextlib.suppress(NotEnoughCapacity):  # another lease took it meanwhile
            return service.create(actor, fixed)
    return service.create(actor, chosen())
