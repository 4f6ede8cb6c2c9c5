"""Recording refused demand (docs/demand.md): one row per reservation of every request
Climate did not serve, written in a short transaction of its own after the refused one rolled
back. Recording never fails a request: an error here is logged and the refusal answered as it
was."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from climate.context import ServiceContext
from climate.db import demand as demand_rows
from climate.db.records import RefusedDemand
from climate.db.tables import Lease
from climate.domain.actor import Actor
from climate.domain.admission import LeaseRefused, Offer, Refusal, Reshape, Skipped, UpdateRefused

log = logging.getLogger(__name__)

REFUSED, TIMED_OUT, GAVE_UP, ABANDONED = "refused", "timed_out", "gave_up", "abandoned"
USAGE_RULE = "usage_rule"
"""The reason of a request a usage rule refused (no capacity rule is named)."""


def _counts(params: Mapping[str, Any]) -> tuple[int, int]:
    """A reservation's (min, max) as asked: ``amount`` for types counted by it."""
    if "min" in params:
        return int(params["min"]), int(params["max"])
    amount = int(params.get("amount", 0))
    return amount, amount


def _reasons(refusal: Refusal, count: int) -> list[str]:
    """Each reservation's rule (``Shortfall.rule``, or ``unexplained``)."""
    found = ["unexplained"] * count
    for s in refusal.shortfalls:
        found[s.index] = s.rule
    return found


def _best(offers: Sequence[Offer]) -> Offer | None:
    """The first offer that gives the whole request, else the first."""
    whole = [o for o in offers if not o.below_request]
    return next(iter(whole or offers), None)


def _row(
    at: dt.datetime,
    owner: tuple[str, str],
    lease: tuple[str | None, str],
    why: tuple[str, str, str, str],
    resource_type: str,
    params: Mapping[str, Any],
    window: tuple[dt.datetime, dt.datetime],
    offer: dict[str, Any] | None = None,
) -> RefusedDemand:
    (project_id, user_id), (lease_id, name), (step, outcome, reason, message) = owner, lease, why
    low, high = _counts(params)
    return RefusedDemand(
        at=at,
        project_id=project_id,
        user_id=user_id,
        lease_id=lease_id,
        lease_name=name,
        step=step,
        outcome=outcome,
        reason=reason,
        message=message[:2000],
        resource_type=resource_type,
        count_min=low,
        count_max=high,
        properties=str(params.get("resource_properties") or ""),
        params=dict(params),
        start_date=window[0],
        end_date=window[1],
        offer=offer,
    )


def _lease_rows(
    ctx: ServiceContext, actor: Actor, refused: LeaseRefused, step: str
) -> list[RefusedDemand]:
    request, refusal = refused.request, refused.refusal
    reasons = _reasons(refusal, len(refused.params))
    best = _best(refusal.offers)
    rows = []
    for i, (r, params) in enumerate(zip(request.reservations, refused.params, strict=True)):
        offer = None
        if best is not None:
            low, high = best.counts[i]
            offer = {
                "kind": best.kind,
                "start": best.start.isoformat(),
                "end": best.end.isoformat(),
                "min": low,
                "max": high,
            }
        rows.append(
            _row(
                ctx.clock.now(),
                (actor.project_id, actor.user_id),
                (None, request.name),
                (step, REFUSED, reasons[i], refused.message),
                str(r.resource_type),
                params,
                (refusal.start, refusal.end),
                offer,
            )
        )
    return rows


def record(ctx: ServiceContext, rows: Sequence[RefusedDemand]) -> None:
    """Write ``rows`` in a transaction of their own; an error is logged, never raised."""
    if not rows:
        return
    try:
        with ctx.db.transaction() as session:
            demand_rows.add(session, rows)
    except Exception:  # never turn a refusal into an error: the refusal is the answer
        log.exception("could not record %d row(s) of refused demand", len(rows))


def lease_refused(ctx: ServiceContext, actor: Actor, refused: LeaseRefused) -> None:
    """A new lease refused for capacity (flexible windows included)."""
    if not refused.request.dry_run:
        record(ctx, _lease_rows(ctx, actor, refused, "create"))


def series_skipped(ctx: ServiceContext, actor: Actor, skipped: Sequence[Skipped]) -> None:
    """Occurrences of a series that did not fit (refused with it, or skipped)."""
    record(ctx, [row for s in skipped for row in _lease_rows(ctx, actor, s.refused, "series")])


def rule_broken(
    ctx: ServiceContext,
    actor: Actor,
    name: str,
    reserved: Sequence[tuple[str, Mapping[str, Any]]],
    window: tuple[dt.datetime, dt.datetime],
    message: str,
    lease_id: str | None = None,
) -> None:
    """A new lease (or, given its ``lease_id``, a lease's update) a usage rule refused:
    ``reserved`` is each reservation's type and parameters."""
    step = "create" if lease_id is None else "update"
    why = (step, REFUSED, USAGE_RULE, message)
    owner = (actor.project_id, actor.user_id)
    at = ctx.clock.now()
    record(ctx, [_row(at, owner, (lease_id, name), why, t, p, window) for t, p in reserved])


def update_refused(
    ctx: ServiceContext, actor: Actor, refused: UpdateRefused, asked: Reshape
) -> None:
    """A lease's update refused for capacity; its best offer is the first update offered."""
    reasons = _reasons(refused.refusal, len(asked.reservations))
    offer = None
    if refused.offers:
        made = refused.offers[0]
        offer = {
            "kind": made.kind,
            "start": (made.changes.start or asked.start).isoformat(),
            "end": (made.changes.end or asked.end).isoformat(),
        }
    at = ctx.clock.now()
    record(
        ctx,
        [
            _row(
                at,
                (actor.project_id, actor.user_id),
                (asked.lease_id, asked.name),
                ("update", REFUSED, reasons[i], refused.message),
                r.resource_type,
                r.params,
                (asked.start, asked.end),
                offer,
            )
            for i, r in enumerate(asked.reservations)
        ],
    )


def unserved(ctx: ServiceContext, lease: Lease, outcome: str, reason: str) -> list[RefusedDemand]:
    """Rows for a lease the queue gave up on or a hold that lapsed, built while its
    transaction is open (``record`` writes them once it has committed)."""
    step = "hold" if outcome == ABANDONED else "queue"
    return [
        _row(
            ctx.clock.now(),
            (lease.project_id, lease.user_id),
            (lease.id, lease.name),
            (step, outcome, reason, lease.status_reason or reason),
            r.resource_type,
            r.params,
            (lease.start_date, lease.end_date),
        )
        for r in lease.reservations
    ]
