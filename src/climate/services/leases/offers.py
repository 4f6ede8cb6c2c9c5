"""What happens around admission: why a lease was refused and what would fit instead
(counter-offers), and flexible windows (docs/admission.md).

Refusals are explained after the refused transaction has rolled back, from a reader session and
the in-memory calendar, as the availability search reads it: no admission lock is held.

The search is bounded: counter-offers look ``offer_search_days`` ahead at most (one vectorised
pass over the calendars, at most three offers); a refused update tries each offer as the update
it is, at most ``UPDATE_TRIALS`` dry-run updates in all (two offers, then a bisection over the
possible ends), each one admission-locked transaction rolled back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from climate.context import ServiceContext
from climate.db import leases as lease_rows
from climate.db.calendar_cache import CalendarCache
from climate.db.engine import ADMISSION_LOCK
from climate.domain.admission import (
    AdmissionRefused,
    LeaseRefused,
    Offer,
    Refusal,
    Refused,
    Reshape,
    UpdateOffer,
    UpdateRefused,
)
from climate.domain.requests import (
    LeaseChanges,
    LeaseRequest,
    RequestedWindow,
    ReservationRequest,
)
from climate.domain.status import ReservationStatus
from climate.errors import InvalidInput, NotEnoughCapacity
from climate.fairshare import admission as fairshare
from climate.planner.availability import (
    CounterOffer,
    Placer,
    SearchRange,
    counter_offers,
    earliest,
)
from climate.planner.calendar import moment, seconds
from climate.resources import pick
from climate.resources.base import ResourceType
from climate.services import demand_record as demand
from climate.services.placing import placers, searchable

if TYPE_CHECKING:
    from climate.db.tables import Lease
    from climate.domain.actor import Actor

OFFER_STEP = 60
"""Later starts are offered on whole minutes (what the blazar CLI can type)."""
SHORTEST_OFFER = 60.0
"""A shorter lease is offered only if it lasts at least this many seconds."""
FLEXIBLE_ATTEMPTS = 3
"""A flexible lease whose chosen window is taken meanwhile is placed again this many times."""
UPDATE_TRIALS = 24
"""The most dry-run updates a refused update's offers cost: two offers, then the bisection for
the latest end (22 halvings: four million possible ends)."""


def refuse(
    ctx: ServiceContext,
    refused: Refused,
    request: LeaseRequest,
    start: dt.datetime,
    params: Sequence[Mapping[str, Any]],
    actor: Actor | None = None,
) -> LeaseRefused:
    """``refused``, explained: why ``request`` does not fit from ``start``, and its offers; with
    ``actor``, only offers no usage rule forbids."""
    refusal = explain(ctx, request, start, request.end, params, actor)
    return LeaseRefused(refused.message, refusal, request, tuple(params))


def _offer_search(
    ctx: ServiceContext,
    begin: float,
    finish: float,
    types: Sequence[ResourceType],
    params: Sequence[Mapping[str, Any]],
) -> tuple[SearchRange, dict[str, list[tuple[int, Mapping[str, Any]]]]]:
    """The range counter-offers look in (the same length, from ``begin`` up to
    ``offer_search_days`` later) and the searchable reservations by type, with their index."""
    duration = math.ceil(finish - begin)
    horizon = ctx.settings.offer_search_days * 86_400
    search = SearchRange(
        math.ceil(begin), math.floor(begin) + horizon + duration, duration, OFFER_STEP
    )
    by_type: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for i, (rtype, p) in enumerate(zip(types, params, strict=True)):
        if searchable(rtype):
            by_type.setdefault(rtype.name, []).append((i, p))
    return search, by_type


def explain(
    ctx: ServiceContext,
    request: LeaseRequest,
    start: dt.datetime,
    end: dt.datetime,
    params: Sequence[Mapping[str, Any]],
    actor: Actor | None = None,
) -> Refusal:
    """Why the reservations of ``request`` do not fit in [start, end), and up to three offers
    that would: the earliest later start (within ``offer_search_days``), the most resources that
    fit in the window, the longest lease from ``start``. Offers are made only when every
    reservation's type can be searched, and, for ``actor``, when no usage rule forbids them
    (``fairshare.forecast``)."""
    types = [ctx.resource_types[str(r.resource_type)] for r in request.reservations]
    unexplained = tuple((i, t.name) for i, t in enumerate(types) if not searchable(t))
    begin, finish = seconds(start), seconds(end)
    search, by_type = _offer_search(ctx, begin, finish, types, params)
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
    if actor is not None and offers and ctx.settings.rules:
        offers = [o for o in offers if not _forbidden(ctx, actor, types, params, o)]
    return Refusal(start, end, tuple(shortfalls), unexplained, tuple(offers))


def _forbidden(
    ctx: ServiceContext,
    actor: Actor,
    types: Sequence[ResourceType],
    params: Sequence[Mapping[str, Any]],
    offer: Offer,
) -> bool:
    planned = [
        fairshare.Planned(t.name, p, count=low)
        for t, p, (low, _) in zip(types, params, offer.counts, strict=True)
    ]
    with ctx.db.reader() as session:
        return bool(fairshare.forecast(ctx, session, actor, offer.start, offer.end, planned))


def _counts(params: Mapping[str, Any]) -> tuple[int, int]:
    """A reservation's (min, max) as asked: ``amount`` for types counted by it."""
    if "min" in params:
        return int(params["min"]), int(params["max"])
    amount = int(params.get("amount", 0))
    return amount, amount


def create_flexible(
    ctx: ServiceContext,
    actor: Actor,
    request: LeaseRequest,
    length: dt.timedelta,
    create: Callable[[LeaseRequest], Lease],
) -> Lease:
    """Create ``request`` at the earliest start in [request.start, request.end] where a lease of
    ``length`` fits, as the availability search finds it; if that window is taken
    before it is admitted, search again (``FLEXIBLE_ATTEMPTS`` in all).

    :raises InvalidInput: a field is wrong (named in the message).
    :raises NotEnoughCapacity: no window fits, with the reason at the earliest start and offers.
    """
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
            message = (
                f"no window of {duration} seconds fits between {start.isoformat()} and "
                f"{request.end.isoformat()}"
            )
            refusal = explain(ctx, request, start, start + length, params)
            explained = LeaseRefused(message, refusal, request, tuple(params))
            demand.lease_refused(ctx, actor, explained)
            raise AdmissionRefused(explained)
        window = found[0]
        return dataclasses.replace(
            request,
            start=moment(window.start),
            end=moment(window.end),
            duration=None,
            requested_window=RequestedWindow(start, request.end, length),
        )

    for _ in range(FLEXIBLE_ATTEMPTS - 1):
        fixed = chosen()
        with contextlib.suppress(NotEnoughCapacity):  # another lease took it meanwhile
            return create(fixed)
    fixed = chosen()
    try:
        return create(fixed)
    except AdmissionRefused as refused:  # only the last try is refused demand
        if isinstance(refused.refused, LeaseRefused):
            demand.lease_refused(ctx, actor, refused.refused)
        raise


# -- refused updates -------------------------------------------------------------------------

WouldUpdate = Callable[[LeaseChanges], bool]
"""Whether the lease's update would be admitted with these changes now (a dry run)."""


def refuse_update(
    ctx: ServiceContext,
    refused: Refused,
    changes: LeaseChanges,
    asked: Reshape,
    would_update: WouldUpdate,
) -> UpdateRefused:
    """``refused``, explained: why the shape ``asked`` does not fit, and the updates that would
    (tried as trials: usage rules judge them, nothing is recorded, the external service is not
    asked)."""
    with fairshare.trial():
        refusal, made = explain_update(ctx, changes, asked, would_update)
    kinds = tuple(r.resource_type for r in asked.reservations)
    return UpdateRefused(refused.message, refusal, kinds, tuple(made))


def explain_update(
    ctx: ServiceContext, changes: LeaseChanges, asked: Reshape, would_update: WouldUpdate
) -> tuple[Refusal, list[UpdateOffer]]:
    """Why ``asked`` does not fit, and up to three updates that would be admitted instead: the
    earliest later start (a lease that has not started, within ``offer_search_days``), the most
    resources that fit in the window, the latest end that fits.

    The lease itself is being re-admitted, so its own allocations must not count as busy: the
    search runs in a transaction that releases them first, under the admission lock, and is
    rolled back. Each offer is then tried as the update it is (``would_update``),
    which also holds a running lease to the resources it has; only those admitted are made."""
    now = ctx.clock.now()
    params = [r.params for r in asked.reservations]
    types = [ctx.resource_types[r.resource_type] for r in asked.reservations]
    unexplained = tuple((i, t.name) for i, t in enumerate(types) if not searchable(t))
    begin_at = max(asked.start, now)
    begin, finish = seconds(begin_at), seconds(asked.end)
    search, by_type = _offer_search(ctx, begin, finish, types, params)
    found: list[CounterOffer] = []
    ends: list[float] = []
    # Rolled back: gives the released allocations back.
    with ctx.db.transaction(lock=ADMISSION_LOCK, rollback=True) as session:
        lease = lease_rows.get(session, asked.lease_id)
        for reservation in [] if lease is None else lease.reservations:
            if reservation.status not in (ReservationStatus.DELETED, ReservationStatus.ERROR):
                ctx.resource_types[reservation.resource_type].release(session, reservation, now)
        for cache in {id(c): c for c in _calendars(ctx)}.values():
            cache.sync(session)  # what releasing instances changed in the host calendar
        with placers(ctx.resource_types, session, by_type, search) as found_placers:
            if unexplained:
                shortfalls = sorted(
                    (s for p in found_placers for s in p.explain(begin, finish)),
                    key=lambda s: s.index,
                )
            else:
                shortfalls, found = counter_offers(
                    found_placers, search, begin, finish, SHORTEST_OFFER
                )
                ends = _possible_ends(found_placers, begin, finish)
    asked_counts = tuple(_counts(p) for p in params)
    made: list[UpdateOffer] = []
    for o in found:
        if o.kind == "later_start" and not asked.started:
            at = moment(o.start)
            until = at + (asked.end - asked.start)
            made.append(_update_offer(o.kind, False, asked, changes, at, until))
        elif o.kind == "fewer_hosts" and o.counts is not None:
            counts = tuple(
                cut if s.reducible else own
                for cut, own, s in zip(o.counts, asked_counts, shortfalls, strict=True)
            )
            made.append(
                _update_offer(
                    o.kind, o.below_request, asked, changes, asked.start, asked.end, counts
                )
            )
    kept = [m for m in made if would_update(m.changes)]
    latest = _latest_end(would_update, asked, changes, ends, UPDATE_TRIALS - len(made))
    if latest is not None:
        kept.append(latest)
    refusal = Refusal(begin_at, asked.end, tuple(shortfalls), unexplained, ())
    return refusal, kept


def _calendars(ctx: ServiceContext) -> list[CalendarCache]:
    found = (getattr(t, "calendar", None) for t in ctx.resource_types.values())
    return [c for c in found if isinstance(c, CalendarCache)]


def _possible_ends(placers: Sequence[Placer], begin: float, end: float) -> list[float]:
    """The ends in [begin + ``SHORTEST_OFFER``, end) where a window from ``begin`` may stop
    fitting, whose counts fit (as ``planner.availability.longest`` tries them), earliest first."""
    ends = np.unique(np.concatenate([p.cutoffs(begin, end) for p in placers]))
    ends = ends[ends >= begin + SHORTEST_OFFER]
    possible = np.ones(len(ends), dtype=np.bool_)
    for placer in placers:
        possible &= placer.possible_ends(begin, ends)
    return [float(e) for e in ends[possible]]


def _latest_end(
    would_update: WouldUpdate,
    asked: Reshape,
    changes: LeaseChanges,
    ends: list[float],
    trials: int,
) -> UpdateOffer | None:
    """The update ending at the latest of ``ends`` that is admitted, by bisection (at most
    ``trials`` steps): a window that fits still fits ending earlier. None if none is, or if it
    would change nothing."""
    best: UpdateOffer | None = None
    low, high = 0, len(ends) - 1
    while low <= high and trials > 0:
        trials -= 1
        middle = (low + high) // 2
        offer = _update_offer("shorter", False, asked, changes, asked.start, moment(ends[middle]))
        if would_update(offer.changes):
            best, low = offer, middle + 1
        else:
            high = middle - 1
    unchanged = (
        best is not None
        and best.changes.end == asked.current_end
        and asked.start == asked.current_start
        and all(r.sent is None for r in asked.reservations)
    )
    return None if unchanged else best


def _update_offer(
    kind: str,
    below_request: bool,
    asked: Reshape,
    changes: LeaseChanges,
    start: dt.datetime,
    end: dt.datetime,
    counts: Sequence[tuple[int, int]] | None = None,
) -> UpdateOffer:
    """The update giving the lease [start, end) and ``counts`` (None: as asked), with the
    other fields of ``changes`` that still apply to that window."""
    reservations = []
    for i, r in enumerate(asked.reservations):
        fields = dict(r.sent or {})
        if counts is not None and counts[i] != _counts(r.params):
            fields.update(_count_fields(r.params, *counts[i]))
        if r.sent is not None or fields:
            reservations.append(ReservationRequest(None, fields, r.id))
    length = end - start
    shift = start - asked.start
    before_end = None
    if changes.before_end is not None and start <= changes.before_end + shift <= end:
        before_end = changes.before_end + shift
    offset = changes.before_end_offset
    reminders = changes.reminders
    now_again = changes.start_now and shift == dt.timedelta(0)
    return UpdateOffer(
        kind,
        below_request,
        dataclasses.replace(
            changes,
            start=None if asked.started or now_again or start == asked.current_start else start,
            start_now=now_again,
            end=end,
            before_end=before_end,
            reservations=tuple(reservations),
            before_end_offset=offset if offset is not None and offset <= length else None,
            reminders=None if reminders is None else tuple(o for o in reminders if o < length),
        ),
    )


def _count_fields(params: Mapping[str, Any], low: int, high: int) -> dict[str, int]:
    """Counts in the reservation's own fields: ``min``..``max``, else ``amount``."""
    if "min" in params:
        return {"min": low, "max": high}
    return {"amount": high} if "amount" in params else {}
